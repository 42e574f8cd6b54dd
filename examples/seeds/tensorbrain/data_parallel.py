"""TensorBrain guide, "Data Parallel Training: Single Machine, Multiple GPUs".

The guide's code with its imports changed (``tensorbrain`` -> ``rankwise.compat.tensorbrain``,
``tb.nn.parallel`` -> ``rankwise.compat.tensorbrain.nn.parallel``); ``tb.nn.ResNet50()`` is
rankwise's own ResNet-50. The guide leaves ``num_epochs`` and ``train_loader`` undefined: the
port trains 1 epoch on 4 random 3x32x32 images in batches of 2 (lines marked "port:"). On a
machine with fewer than 2 GPUs the model is not wrapped, as in the guide. One plain process:

    python examples/seeds/tensorbrain/data_parallel.py
"""

import rankwise.compat.tensorbrain as tb
from rankwise.compat.tensorbrain.nn.parallel import DataParallel

# port: the guide's num_epochs and train_loader, tiny and made on the fly
tb.manual_seed(0)
num_epochs = 1
train_loader = tb.utils.data.DataLoader(
    tb.utils.data.TensorDataset(tb.rand(4, 3, 32, 32), tb.randint(0, 1000, (4,))), batch_size=2
)

model = tb.nn.ResNet50()
device = "cuda" if tb.cuda.is_available() else "cpu"
model = model.to(device)

# Wrap model for data parallelism
if tb.cuda.device_count() > 1:
    model = DataParallel(model)
    print(f"Using {tb.cuda.device_count()} GPUs")

# Training loop remains the same
criterion = tb.nn.CrossEntropyLoss()
optimizer = tb.optim.Adam(model.parameters())

for epoch in range(num_epochs):
    for batch_data, batch_labels in train_loader:
        batch_data = batch_data.to(device)
        batch_labels = batch_labels.to(device)

        outputs = model(batch_data)
        loss = criterion(outputs, batch_labels)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"epoch {epoch} outputs {tuple(outputs.shape)} loss {loss.item():.4f}")  # port

# port: what ran, for the test
parameters = sum(p.numel() for p in model.parameters())
print(f"trained {type(model).__name__} ({parameters:,} parameters) on {device}")
