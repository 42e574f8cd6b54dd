"""FRAMEWORM guide, "Single Machine, Multiple GPUs: DataParallel (Simple, lower performance)".

The guide's code with its import changed (``from frameworm import ...`` ->
``from rankwise.compat.frameworm import ...``), run as one plain process from this folder,
where ``config.yaml`` is:

    cd examples/seeds/frameworm && python data_parallel.py

What a port must add or change is marked "port:":

- The guide leaves ``train_loader`` and ``val_loader`` undefined: the port makes 64 training
  and 16 validation samples on the fly (``config.data``), 16 features each, lying near a
  4-dimensional subspace so the VAE has something to learn.
- ``device='cuda'`` needs a GPU: without one the port passes ``'cpu'``. With 2 or more GPUs
  the model is wrapped in ``DataParallel`` as in the guide, and the trainer uses that wrapper
  as it is.
"""

import torch

from rankwise.compat.frameworm import Config, Trainer, get_model

# Create model
config = Config.from_file("config.yaml")

# port: the guide's train_loader and val_loader, tiny and made on the fly
torch.manual_seed(0)
basis = torch.randn(4, config.model.input_dim)
samples = config.data.train_samples + config.data.val_samples
data = torch.randn(samples, 4) @ basis + 0.1 * torch.randn(samples, config.model.input_dim)
train_loader = torch.utils.data.DataLoader(
    data[: config.data.train_samples], batch_size=16, shuffle=True
)
val_loader = torch.utils.data.DataLoader(data[config.data.train_samples :], batch_size=16)

model = get_model("vae")(config)

# Wrap in DataParallel
if torch.cuda.device_count() > 1:
    model = torch.nn.DataParallel(model)
    print(f"Using {torch.cuda.device_count()} GPUs")

optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
trainer = Trainer(
    model, optimizer, device="cuda" if torch.cuda.is_available() else "cpu"
)  # port: 'cuda'

history = trainer.train(train_loader, val_loader, epochs=50)  # port: `history =`, for the prints

# port: what the test checks
print(f"model {type(trainer.model).__name__} around {type(trainer.module).__name__}")
print(f"train loss {history.train_losses[0]:.4f} -> {history.train_losses[-1]:.4f}")
print(f"val loss {history.val_losses[0]:.4f} -> {history.val_losses[-1]:.4f}")
print(f"epochs {history.epochs}")
