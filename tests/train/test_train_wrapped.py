"""The trainer with a model that computes its own loss, a chosen device, and a model the user
wrapped already (DataParallel, DDP): trained as it is, never wrapped twice."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import rankwise.distributed as rd
from rankwise.models import MLP, VAE
from rankwise.parallel import enable_gradient_checkpointing, find_blocks
from rankwise.testing import run_distributed
from rankwise.train import DistributedTrainer, DistributedTrainingConfig, model_state_dict

CFG = {"epochs": 2, "batch_size": 8, "verbose": False, "checkpoint_dir": None}


def test_vae_loss_is_recon_plus_kl_and_eval_is_deterministic() -> None:
    torch.manual_seed(0)
    vae = VAE(6, 2, hidden_dim=5, beta=0.5)
    x = torch.randn(4, 6)
    out = vae(x)
    assert torch.allclose(out["loss"], out["recon_loss"] + 0.5 * out["kl"])
    vae.eval()
    assert torch.equal(vae(x)["recon"], vae(x)["recon"])  # z = mu: no sampling
    assert torch.equal(vae(x.view(4, 2, 3))["recon"], vae(x)["recon"])  # any [B, ...] shape


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: VAE(0, 2), r"VAE\.input_dim \(0\) must be an integer >= 1"),
        (lambda: VAE(4, 2, beta=-1), r"VAE\.beta \(-1\) must be a number >= 0"),
        (lambda: MLP(4, 3, depth=0), r"MLP\.depth \(0\) must be an integer >= 1"),
        (lambda: VAE(4, 2)(torch.zeros(3, 5)), r"input_dim \(4\) features each, got \(3, 5\)"),
    ],
)
def test_model_errors_name_the_value(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_block_names_choose_the_checkpointed_blocks() -> None:
    vae = VAE(6, 2)
    assert find_blocks(vae) == [vae.encoder, vae.decoder]
    calls = []
    vae.encoder[0].register_forward_hook(lambda *_: calls.append(1))
    assert enable_gradient_checkpointing(vae) == ["encoder", "decoder"]
    vae(torch.randn(3, 6))["loss"].backward()
    assert len(calls) == 2  # the encoder ran again in the backward pass (recomputed)

    class Bad(nn.Module):
        block_names = ("missing",)

    with pytest.raises(ValueError, match=r"Bad\.block_names names 'missing'"):
        find_blocks(Bad())


def test_trainer_trains_a_model_that_returns_its_loss() -> None:
    torch.manual_seed(0)
    vae = VAE(6, 2, hidden_dim=8)
    trainer = DistributedTrainer(vae, None, torch.optim.Adam(vae.parameters(), lr=0.01))
    data = torch.randn(32, 6)
    history = trainer.fit(DataLoader(data, batch_size=8), val=DataLoader(data, batch_size=8),
                          config=DistributedTrainingConfig(**CFG))  # fmt: skip
    assert history.train_losses[1] < history.train_losses[0]
    assert history.train_accuracies == [None, None]  # no class targets
    assert history.val_losses[1] is not None


def test_data_parallel_model_is_used_as_it_is_and_saves_plain_keys() -> None:
    net = nn.Sequential(nn.Linear(4, 3))
    wrapped = nn.DataParallel(net)  # on a CPU machine: no devices, forward calls the module
    trainer = DistributedTrainer(wrapped, nn.CrossEntropyLoss(),
                                 torch.optim.SGD(wrapped.parameters(), lr=0.1), device="cpu")  # fmt: skip
    trainer.fit(torch.randn(16, 4), torch.randint(0, 3, (16,)), DistributedTrainingConfig(**CFG))
    assert trainer.model is wrapped and trainer.module is net
    assert sorted(model_state_dict(wrapped)) == ["0.bias", "0.weight"]  # no "module." prefix


def test_bad_device_and_compression_on_a_wrapped_model_are_refused() -> None:
    net = nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"device \('tpu9'\) is not a torch device"):
        DistributedTrainer(net, None, opt, device="tpu9")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device \('cuda'\) is a CUDA device, but"):
            DistributedTrainer(net, None, opt, device="cuda")
    trainer = DistributedTrainer(nn.DataParallel(net), nn.MSELoss(), opt)
    cfg = DistributedTrainingConfig(**CFG, compression="fp16")
    with pytest.raises(ValueError, match=r"compression \('fp16'\) is applied when rankwise wraps"):
        trainer.fit(torch.randn(8, 2), torch.randn(8, 2), cfg)


def _train_given_ddp() -> tuple[str, float, list[int]]:
    torch.manual_seed(rd.get_rank())  # different initial weights: DDP broadcasts rank 0's
    model = DDP(VAE(6, 2, hidden_dim=8))
    data = torch.randn(32, 6, generator=torch.Generator().manual_seed(0))
    sampler = DistributedSampler(data, shuffle=True)
    trainer = DistributedTrainer(model, None, torch.optim.Adam(model.parameters(), lr=0.01))
    trainer.fit(DataLoader(data, batch_size=4, sampler=sampler),
                config=DistributedTrainingConfig(**CFG))  # fmt: skip
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return type(trainer.model).__name__, checksum, sorted(sampler)


@pytest.mark.timeout(120)
def test_ddp_model_passed_in_is_not_wrapped_again_and_stays_in_sync() -> None:
    (kind0, sum0, ids0), (kind1, sum1, ids1) = run_distributed(_train_given_ddp, 2, timeout=100)
    assert kind0 == kind1 == "DistributedDataParallel"
    assert sum0 == sum1
    assert sorted(ids0 + ids1) == list(range(32))  # torch's sampler split the data


class TwoReplicaDP(nn.DataParallel):  # type: ignore[type-arg]
    """What a DataParallel over 2 GPUs returns, on CPU: the replicas' scalar losses gathered
    into a [2] vector (torch's gather), the rest concatenated."""

    def forward(self, x: torch.Tensor) -> Any:
        a, b = self.module(x[: len(x) // 2]), self.module(x[len(x) // 2 :])
        return {k: torch.stack([a[k], b[k]]) if a[k].dim() == 0 else torch.cat([a[k], b[k]])
                for k in a}  # fmt: skip


def test_data_parallel_vector_loss_is_averaged_in_training_and_evaluation() -> None:
    torch.manual_seed(0)
    model = TwoReplicaDP(VAE(6, 2, hidden_dim=8))
    trainer = DistributedTrainer(model, None, torch.optim.Adam(model.parameters(), lr=0.01),
                                 device="cpu")  # fmt: skip
    data = torch.randn(32, 6)
    history = trainer.fit(DataLoader(data, batch_size=8), val=DataLoader(data, batch_size=8),
                          config=DistributedTrainingConfig(**CFG))  # fmt: skip
    assert history.train_losses[1] < history.train_losses[0]
    halves = [model.module.eval()(data[i : i + 4])["loss"] for i in range(0, 32, 4)]
    assert history.val_losses[1] == pytest.approx(torch.stack(halves).mean().item(), rel=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_data_parallel_on_two_gpus_trains_the_vae() -> None:
    torch.manual_seed(0)
    model = nn.DataParallel(VAE(6, 2, hidden_dim=8))  # left on the CPU, as the guide does
    trainer = DistributedTrainer(model, None, torch.optim.Adam(model.parameters(), lr=0.01),
                                 device="cuda")  # fmt: skip
    history = trainer.fit(DataLoader(torch.randn(32, 6), batch_size=8),
                          config=DistributedTrainingConfig(**CFG))  # fmt: skip
    assert history.train_losses[1] < history.train_losses[0]
    assert next(model.parameters()).device == torch.device("cuda", 0)
    with pytest.raises(
        ValueError, match=r"DataParallel on cuda:0, but the trainer's device is cpu"
    ):
        DistributedTrainer(model, None, torch.optim.Adam(model.parameters()), device="cpu").fit(
            DataLoader(torch.randn(8, 6), batch_size=8), config=DistributedTrainingConfig(**CFG)
        )


def _misfit_ddp() -> list[str]:
    errors = []
    for device, strategy in (("cpu", "none"), ("meta", "ddp")):
        model = DDP(nn.Linear(2, 2))
        trainer = DistributedTrainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters()),
                                     device=device)  # fmt: skip
        cfg = DistributedTrainingConfig(**CFG, strategy=strategy)
        with pytest.raises(ValueError) as info:
            trainer.fit(torch.randn(8, 2), torch.randn(8, 2), cfg)
        errors.append(str(info.value))
    return errors


@pytest.mark.timeout(120)
def test_ddp_under_strategy_none_or_on_another_device_is_refused() -> None:
    for none, meta in run_distributed(_misfit_ddp, 2, timeout=100):
        assert "strategy is 'none' but the model came wrapped in DistributedDataParallel" in none
        assert "set strategy='ddp'" in none
        assert "DistributedDataParallel on cpu, but the trainer's device is meta" in meta
        assert "pass device='cpu'" in meta


def _user_powersgd(ckpt: str, epochs: int, resume: str | None) -> tuple[list[float], int]:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    state = P.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    model.register_comm_hook(state, P.powerSGD_hook)
    trainer = DistributedTrainer(model, nn.CrossEntropyLoss(),
                                 torch.optim.Adam(model.parameters(), lr=0.01))  # fmt: skip
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g)
    cfg = DistributedTrainingConfig(epochs=epochs, batch_size=4, verbose=False,
                                    checkpoint_dir=ckpt, resume=resume)  # fmt: skip
    history = trainer.fit(x, y, cfg)
    return history.train_losses, state.iter


@pytest.mark.timeout(200)
def test_resume_continues_a_powersgd_state_registered_on_the_users_ddp(tmp_path: Any) -> None:
    (losses, straight), _ = run_distributed(_user_powersgd, 2, args=(str(tmp_path / "a"), 2, None),
                                            timeout=90)  # fmt: skip
    run_distributed(_user_powersgd, 2, args=(str(tmp_path / "b"), 1, None), timeout=90)
    (resumed_losses, resumed), _ = run_distributed(
        _user_powersgd, 2, args=(str(tmp_path / "b"), 2, "auto"), timeout=90
    )
    assert resumed == straight  # the iteration counter went on from the checkpoint, not from 0
    assert len(resumed_losses) == len(losses) == 2  # (losses differ: residuals are per rank)


def _user_hook_warns() -> str:
    model = DDP(nn.Linear(2, 2))
    model.register_comm_hook({"mine": 1}, lambda state, bucket: _allreduce(bucket))
    trainer = DistributedTrainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters()))
    with pytest.warns(UserWarning, match=r"comm hook state \(dict\) is not checkpointed") as w:
        trainer.fit(torch.randn(8, 2), torch.randn(8, 2), DistributedTrainingConfig(**CFG))
    return str(w[0].message)


def _allreduce(bucket: Any) -> Any:
    tensor = bucket.buffer().div_(rd.get_world_size())
    fut = torch.distributed.all_reduce(tensor, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


@pytest.mark.timeout(120)
def test_other_user_hook_state_warns_it_is_not_checkpointed() -> None:
    for message in run_distributed(_user_hook_warns, 2, timeout=100):
        assert "compression='powersgd'" in message
