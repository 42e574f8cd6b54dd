"""FRAMEWORM guide, "Performance Tips: 1. Gradient Accumulation for Large Batches".

The guide's loop as it is (it imports nothing), in one plain process from this folder:

    cd examples/seeds/frameworm && python accumulation.py

Lines marked "port:" make the guide's undefined ``model``, ``optimizer`` and ``train_loader``
(the VAE of ``config.yaml``, 64 samples in batches of 8) and check what the loop does: with
the VAE in eval mode (no sampling, so every forward is deterministic) 4 micro-batches of 8
with ``loss / 4`` leave the same gradient as one batch of 32. Under DDP the loop would
all-reduce every micro-batch; ``rankwise.parallel.accumulate`` (``no_sync``) or the trainer's
``grad_accum_steps=4`` sync once per step.
"""

import torch  # port

from rankwise.compat.frameworm import Config, get_model  # port

torch.manual_seed(0)  # port
model = get_model("vae")(Config.from_file("config.yaml"))  # port
model.eval()  # port: z = mu, so the check below compares like with like
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # port
data = torch.randn(64, model.input_dim)  # port
train_loader = torch.utils.data.DataLoader(data, batch_size=8)  # port
reference = torch.autograd.grad(model(data[:32])["loss"], list(model.parameters()))  # port
steps = 0  # port

accumulation_steps = 4

for i, batch in enumerate(train_loader):
    output = model(batch)
    loss = output["loss"] / accumulation_steps
    loss.backward()

    if (i + 1) % accumulation_steps == 0:
        if steps == 0:  # port: the first step's gradient against one batch of 32
            diff = max(
                (p.grad - g).abs().max().item()
                for p, g in zip(model.parameters(), reference, strict=True)
            )
            print(f"gradient of 4 x 8 vs 1 x 32: max difference {diff:.2e}")
        steps += 1  # port
        optimizer.step()
        optimizer.zero_grad()

print(f"{i + 1} micro-batches, {steps} optimizer steps")  # port
