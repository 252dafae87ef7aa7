"""The optimisation step: LCE on the scoring core's own differentiable forward.

The model trained is the module that serves: :class:`~acare_ray.scoring.causal.fast.PrefixSharedYesNo` for
causal LMs (several groups per forward, each prefix run once) or :class:`PairScorer` around the
cross-encoder's ``forward_ids``. Scores are the raw log-odds of the scoring contract; the loss is
:func:`acare_ray.training.loss.lce_loss` (temperature only there). On CUDA the forward runs under bf16
autocast over float32 weights; on CPU everything is float32 unless ``cpu_bf16`` asks for bf16
autocast there too (``"auto"``: only where the CPU computes bf16 natively, :func:`use_cpu_bf16`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from acare_ray.scoring import Scorer
from acare_ray.training.collator import Batch
from acare_ray.training.loss import lce_loss


def trainable_module(scorer: Scorer, chunk_tokens: int | None = None) -> nn.Module:
    """The differentiable scoring module of a :class:`~acare_ray.scoring.scorer.Scorer`.

    ``chunk_tokens`` (cross-encoders only): each micro-batch runs sorted by length in chunks of at
    most that many padded tokens (:class:`~acare_ray.scoring.cross_encoder.PairScorer`); the
    causal backend's module shares prefixes and sizes its own calls, so it refuses the setting.
    """
    if chunk_tokens is None:
        return scorer.backend.trainable_module()
    from acare_ray.scoring.cross_encoder import CrossEncoderBackend, PairScorer

    if not isinstance(scorer.backend, CrossEncoderBackend):
        raise ValueError(
            f"chunk_tokens applies to cross-encoders; the {scorer.backend.name} backend sizes "
            "its own calls (leave chunk_tokens unset)"
        )
    return PairScorer(scorer.backend, chunk_tokens)


def freeze_lowest(hf_model: nn.Module, embeddings: bool, layers: int) -> int:
    """Stop training the embeddings (``embeddings``) and the lowest ``layers`` transformer
    layers of a Hugging Face model; returns how many parameters were frozen.

    Frozen parameters get no gradient and no optimizer state (:func:`build_optimizer` skips
    them); the backward pass stops below the lowest trained layer once the embeddings are frozen
    too. In a model whose output head shares the input embedding matrix (tied weights, as in
    Qwen3-0.6B), freezing the embeddings freezes that head as well.
    """
    blocks: list[nn.Module] = []
    base = getattr(hf_model, "base_model", hf_model)
    if embeddings:
        blocks.append(getattr(base, "embeddings", None) or hf_model.get_input_embeddings())
    if layers:
        stack = _layer_stack(base)
        if not 0 <= layers <= len(stack):
            raise ValueError(f"freeze_layers is {layers}; the model has {len(stack)} layers")
        blocks.extend(stack[:layers])
    frozen = 0
    for block in blocks:
        for param in block.parameters():
            if param.requires_grad:
                param.requires_grad_(False)
                frozen += param.numel()
    return frozen


def _layer_stack(base: nn.Module) -> nn.ModuleList:
    """The transformer layers of a base model (``encoder.layer`` in BERT-style models,
    ``layers`` in decoder-only ones)."""
    encoder = getattr(base, "encoder", None)
    for stack in (getattr(encoder, "layer", None), getattr(base, "layers", None)):
        if isinstance(stack, nn.ModuleList):
            return stack
    raise ValueError(f"freeze_layers: no layer list found in {type(base).__name__}")


def build_optimizer(module: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; biases and norm weights (1-D parameters) get no weight decay."""
    decay, no_decay = [], []
    for param in module.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr)


def warmup_linear(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Learning rate: linear from 0 to the peak over ``warmup_steps``, then linear to 0."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    return math.floor(total_steps * warmup_ratio)


def native_cpu_bf16() -> bool:
    """Whether this CPU runs bf16 matrix products natively (oneDNN's bf16 support: AVX512-BF16,
    AMX or the AVX512 core set). Without it bf16 autocast is emulated: on a 2-core AVX2 EPYC a
    MiniLM forward + backward took 112 s in bf16 against 7 s in float32 (docs/speed.md)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def use_cpu_bf16(setting: bool | str) -> bool:
    """Resolve ``cpu_bf16`` (``True``, ``False`` or ``"auto"``) on this machine: ``"auto"`` is
    bf16 autocast where the CPU has native bf16 and float32 elsewhere."""
    if setting == "auto":
        return native_cpu_bf16()
    if isinstance(setting, bool):
        return setting
    raise ValueError(f"cpu_bf16 must be true, false or 'auto', got {setting!r}")


def autocast(device: torch.device, cpu_bf16: bool = False) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA; on CPU float32, or bf16 autocast when ``cpu_bf16`` (a speed
    lever on CPUs with native bf16 instructions; docs/speed.md has its measurement)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if cpu_bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _no_sync(model: nn.Module, skip: bool) -> contextlib.AbstractContextManager:
    if skip and hasattr(model, "no_sync"):
        return model.no_sync()
    if skip and hasattr(model, "set_requires_gradient_sync"):
        return _fsdp2_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp2_no_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


@dataclass(frozen=True)
class StepStats:
    """One optimizer step: mean LCE over its micro-batches, grad norm before clipping, lr used."""

    loss: float
    grad_norm: float
    lr: float


def train_step(
    model: nn.Module,
    batches: Sequence[Batch],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    group_size: int,
    temperature: float,
    max_grad_norm: float | None,
    device: torch.device,
    cpu_bf16: bool = False,
) -> StepStats:
    """Forward/backward over ``batches`` (gradient accumulation), clip, step, schedule.

    Each micro-batch's loss is scaled by ``1 / len(batches)``, so the update equals one step on
    their union when micro-batches hold equal numbers of groups. DDP/FSDP gradient sync happens
    on the last micro-batch only.
    """
    if not batches:
        raise ValueError("train_step needs at least one batch")
    model.train()
    total = 0.0
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        with _no_sync(model, skip=not last):
            with autocast(device, cpu_bf16):
                scores = model(*batch.to(device).inputs())
            loss = lce_loss(scores, group_size=group_size, temperature=temperature)
            (loss / len(batches)).backward()
        total += float(loss.detach())
    if max_grad_norm is not None:
        norm = clip_grad_norm(model, max_grad_norm)
    else:
        norm = clip_grad_norm(model, float("inf"))
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepStats(loss=total / len(batches), grad_norm=norm, lr=lr)


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip the global grad norm (FSDP1 modules clip across shards themselves)."""
    if hasattr(model, "clip_grad_norm_"):
        norm = model.clip_grad_norm_(max_norm)
    else:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


class WeightAverage:
    """An exponential moving average of a module's trainable weights (Polyak averaging).

    After each optimizer step, :meth:`update` moves every average toward the weight by
    ``1 - rate``, where ``rate = min(decay, (1 + n) / (10 + n))`` after ``n`` earlier updates:
    the average follows the weights closely at the start and settles at ``decay`` (a window of
    about ``1 / (1 - decay)`` steps) once ``n`` is large, as TensorFlow's
    ``ExponentialMovingAverage(num_updates=...)`` does. Frozen weights (no gradient) never change
    and are not copied. :meth:`applied` puts the averages into the module in place, so the
    scorer that wraps it validates and saves the averaged model through its own code, and
    restores the trained weights on exit.

    Written here rather than with ``torch.optim.swa_utils.AveragedModel``: that keeps a second
    copy of the whole module, which the scorer would not score or save through, and its EMA has
    no warm-up of the decay.
    """

    def __init__(self, module: nn.Module, decay: float, updates: int = 0) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay, self.updates = decay, updates
        self.averages = {
            name: param.detach().clone()
            for name, param in module.named_parameters()
            if param.requires_grad
        }

    def rate(self) -> float:
        """The decay the next update applies."""
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        rate = self.rate()
        for name, param in module.named_parameters():
            if name in self.averages:
                self.averages[name].lerp_(param.detach(), 1 - rate)
        self.updates += 1

    @contextlib.contextmanager
    def applied(self, module: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
        """Inside, ``module`` holds the averages; yields the trained weights it held before
        (what a checkpoint must keep to resume training), restored on exit."""
        params = dict(module.named_parameters())
        trained = {name: params[name].detach().clone() for name in self.averages}
        with torch.no_grad():
            for name, average in self.averages.items():
                params[name].copy_(average)
        try:
            yield trained
        finally:
            with torch.no_grad():
                for name, weights in trained.items():
                    params[name].copy_(weights)

    def load_into(self, module: nn.Module) -> None:
        """Leave the averages in ``module`` for good (the end of training)."""
        params = dict(module.named_parameters())
        with torch.no_grad():
            for name, average in self.averages.items():
                params[name].copy_(average)
