"""CyxWiz guide, "Quick Start" (2. Write Training Script), with its import changed.

Launched as the guide launches it (3. Launch Training), from any folder:

    scripts/launch_distributed.sh 2 python examples/seeds/cyxwiz/quick_start.py
    RANK=0 WORLD_SIZE=2 MASTER_PORT=29511 python examples/seeds/cyxwiz/quick_start.py &
    RANK=1 WORLD_SIZE=2 MASTER_PORT=29511 python examples/seeds/cyxwiz/quick_start.py &

It writes ``model.cyxmodel`` and ``checkpoints/`` in the current folder, as the guide's does.
The guide never defines ``X_train`` / ``y_train``: the port makes 256 MNIST-shaped samples
(784 features, 10 classes) whose labels a linear map decides, so the loss can fall, and
prints the history for the test (lines marked "port:").
"""

import numpy as np  # port

import rankwise.compat.cyxwiz as cx

# --- port: a tiny data set in the guide's shapes (numpy arrays, as the guide passes) ---
rng = np.random.default_rng(0)
X_train = rng.standard_normal((256, 784)).astype(np.float32)
y_train = (X_train @ rng.standard_normal((784, 10))).argmax(axis=1)
# --- end of port setup ---

# Initialize distributed
cx.distributed.init()

# Create model
model = cx.SequentialModel()
model.add(cx.LinearModule(784, 256))
model.add(cx.ReLUModule())
model.add(cx.LinearModule(256, 10))

# Create trainer
trainer = cx.distributed.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.001))

# Configure and train
config = cx.distributed.DistributedTrainingConfig()
config.epochs = 10
config.batch_size = 64  # Per-GPU batch size

history = trainer.fit(X_train, y_train, config)

# Save model (master only)
if trainer.is_master():
    model.save("model.cyxmodel")

checksum = sum(p.double().sum().item() for p in model.parameters())  # port
print(  # port
    f"rank {trainer.get_rank()}/{trainer.get_world_size()}: losses {history.train_losses} "
    f"accuracies {history.train_accuracies} effective_batch_size "
    f"{history.effective_batch_size} checksum {checksum!r}"
)

cx.distributed.finalize()
