"""CyxWiz guide, "Python API Reference": DistributedTrainer (High-Level API) and
DistributedTrainingHistory, and "Best Practices" 2 (Only Save/Log on Master) and 3 (Scale
Learning Rate with Batch Size), with the import changed.

    scripts/launch_distributed.sh 2 python examples/seeds/cyxwiz/trainer.py

It writes ``model.ckpt``, ``checkpoint.ckpt`` and ``checkpoints/`` in the current folder. What the
port adds (marked "port:"): the model, loss, optimizer and data the guide leaves undefined (400
samples of 20 features, 4 classes a linear map decides; numpy arrays as the guide passes), the
epoch and sizes the best practices use, and prints for the test. The guide's history snippet
starts with ``history = trainer.fit(...)``, its ``...`` standing for the arguments above: the
port reads the history of the fit with validation data instead of fitting a third time.
"""

# ruff: noqa: B018  (port: the guide lists the history fields as bare expressions)
import numpy as np  # port

import rankwise.compat.cyxwiz as cx

# --- port: what the guide's snippets leave undefined ---
rng = np.random.default_rng(1)
X_all = rng.standard_normal((600, 20)).astype(np.float32)
y_all = (X_all @ rng.standard_normal((20, 4))).argmax(axis=1)
X_train, y_train = X_all[:400], y_all[:400]
X_val, y_val = X_all[400:500], y_all[400:500]
X_test, y_test = X_all[500:], y_all[500:]
cx.distributed.init()
model = (
    cx.SequentialModel()
    .add(cx.LinearModule(20, 32))
    .add(cx.ReLUModule())
    .add(cx.LinearModule(32, 4))
)
loss_fn = cx.CrossEntropyLoss()
optimizer = cx.AdamOptimizer(0.01)
# --- end of port setup ---

# Create trainer
trainer = cx.distributed.DistributedTrainer(model, loss_fn, optimizer)

# Configure
config = cx.distributed.DistributedTrainingConfig()
config.epochs = 10
config.batch_size = 64  # Per-GPU
config.shuffle = True
config.seed = 42
config.verbose = True
config.log_every_n_batches = 10
config.checkpoint_every_n_epochs = 5
config.checkpoint_dir = "./checkpoints"
config.save_on_master_only = True
config.validation_split = 0.1

# Train
history = trainer.fit(X_train, y_train, config)
print(
    f"rank {trainer.get_rank()}: split val_losses {len(history.val_losses)} {history.val_losses[-1]!r}"
)  # port
# Or with validation data:
history = trainer.fit(X_train, y_train, X_val, y_val, config)

# Evaluate
loss, accuracy = trainer.evaluate(X_test, y_test)
print(f"rank {trainer.get_rank()}: evaluate {loss!r} {accuracy!r}")  # port

# Checkpointing
trainer.save_checkpoint("model.ckpt")
trainer.load_checkpoint("model.ckpt")
print(f"rank {trainer.get_rank()}: reloaded evaluate {trainer.evaluate(X_test, y_test)!r}")  # port

# Info
trainer.is_master()
trainer.get_rank()
trainer.get_world_size()

# --- DistributedTrainingHistory ---
# history = trainer.fit(...)   port: the history of the fit above

history.train_losses  # List[float] - per epoch
history.train_accuracies  # List[float] - per epoch
history.val_losses  # List[float] - per epoch
history.val_accuracies  # List[float] - per epoch
history.total_time_seconds  # float
history.samples_per_second  # float - throughput
history.effective_batch_size  # int - batch_size * world_size
history.world_size  # int
print(  # port
    f"rank {trainer.get_rank()}: history {len(history.train_losses)} {history.train_losses[0]!r} "
    f"{history.train_losses[-1]!r} {history.val_accuracies[-1]!r} {history.total_time_seconds > 0} "
    f"{history.samples_per_second > 0} {history.effective_batch_size} {history.world_size} "
    f"info {trainer.is_master()} {trainer.get_world_size()}"
)

# --- Best practice 2: Only Save/Log on Master ---
epoch, loss = len(history.train_losses) - 1, history.train_losses[-1]  # port
if trainer.is_master():
    print(f"Epoch {epoch}: Loss = {loss}")
    model.save("checkpoint.ckpt")

# --- Best practice 3: Scale Learning Rate with Batch Size ---
batch_size, world_size = config.batch_size, trainer.get_world_size()  # port
# Linear scaling rule
base_lr = 0.001
base_batch_size = 64
effective_batch_size = batch_size * world_size
scaled_lr = base_lr * (effective_batch_size / base_batch_size)
print(f"rank {trainer.get_rank()}: scaled_lr {scaled_lr!r}")  # port
cx.distributed.finalize()  # port
