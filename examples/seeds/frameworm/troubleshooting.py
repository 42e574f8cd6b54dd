"""FRAMEWORM guide, "Troubleshooting: OOM on some GPUs" (``trainer.enable_gradient_checkpointing()``).

The guide's line with the Trainer of its DataParallel example around it, in one plain
process from this folder:

    cd examples/seeds/frameworm && python troubleshooting.py

Lines marked "port:" build the trainer and check that checkpointing changes memory, not
results: the VAE's encoder and decoder are recomputed in the backward pass, and 3 epochs end
with the same parameters as without checkpointing. The guide's other tips: NCCL_TIMEOUT is not
a variable NCCL or torch reads (the timeout is ``init_process_group(timeout=...)``; rankwise's
is DISTRIBUTED_TIMEOUT_MS / DISTRIBUTED_COLLECTIVE_TIMEOUT_MS), NCCL_DEBUG=INFO is real;
"gradient compression" is ``DDPConfig(compression=...)``, "FP16" ``precision="fp16"``,
"reduce communication frequency" ``grad_accum_steps``.
"""

import torch  # port

from rankwise.compat.frameworm import Config, Trainer, get_model  # port


def run(checkpointing):  # type: ignore[no-untyped-def]  # port
    torch.manual_seed(0)
    config = Config.from_file("config.yaml")
    model = get_model("vae")(config)
    data = torch.randn(32, config.model.input_dim)
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    trainer = Trainer(model, torch.optim.Adam(model.parameters(), lr=0.001), verbose=False)
    blocks = None
    if checkpointing:
        # Reduce batch size or enable gradient checkpointing
        blocks = trainer.enable_gradient_checkpointing()  # port: `blocks =`
    history = trainer.train(loader, epochs=3)
    return blocks, history.train_losses[-1], [p.detach().clone() for p in model.parameters()]


blocks, loss, params = run(True)  # port
_, plain_loss, plain_params = run(False)  # port
same = all(
    torch.allclose(a, b, atol=1e-6) for a, b in zip(params, plain_params, strict=True)
)  # port
print(f"checkpointed blocks {blocks}; loss {loss:.6f} vs {plain_loss:.6f}; same parameters {same}")
