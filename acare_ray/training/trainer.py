"""LCE fine-tuning as a Ray Train (V2) job: ``run(TrainConfig) -> final checkpoint path``.

``run`` starts a ``TorchTrainer`` with ``ScalingConfig(num_workers, use_gpu)`` and
``RunConfig(storage_path=output, name=name)``. Each worker loads the scorer, wraps its
differentiable module in DDP (``prepare_model``; gloo on CPU, NCCL on GPUs) or FSDP2
(``fully_shard``), and trains on its share of every global batch. Every ``checkpoint_every``
steps and at the end, the workers validate (nDCG@10 per mode), rank 0 writes a servable
checkpoint, and all report it; Ray Train keeps the last ``keep_checkpoints``. With ``ema_decay``
the weights validated and saved are the moving average (:class:`WeightAverage`), and the trained
weights travel in ``trainer_state.pt`` so a resumed run trains on from them.

Resuming: Ray Train V2 reloads the run's checkpoint list from ``<output>/<name>`` when a run
with the same name and storage path starts, and ``ray.train.get_checkpoint()`` returns the latest
one. The worker then loads weights, optimizer and scheduler from it and continues at the saved
step; data order and dropout are functions of (seed, step), so the continuation sees the same
groups the interrupted run would have. A checkpoint without ``trainer_state.pt`` still resumes:
from its weights, with fresh optimizer state and the learning-rate schedule fast-forwarded to
the saved step (``training.json`` lists such steps under ``optimizer_restarts``).

Checkpoints are staged under the run's own storage (``<output>/<name>/.acare-staging``), not
``/tmp``, written atomically, and removed once Ray Train has persisted them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from acare_ray.scoring import FieldDropout
from acare_ray.training import checkpoint as ckpt
from acare_ray.training.collator import GroupCollator
from acare_ray.training.config import TrainConfig
from acare_ray.training.loop import (
    WeightAverage,
    build_optimizer,
    freeze_lowest,
    train_step,
    trainable_module,
    use_cpu_bf16,
    warmup_linear,
    warmup_steps,
)
from acare_ray.training.plan import load_splits, step_groups, steps_per_epoch, total_steps
from acare_ray.training.stopping import selection
from acare_ray.training.validation import validate

log = logging.getLogger("acare_ray.training")

SELECTION_SCORE = "selection/best_step"
GOLDEN_GROUPS = 4  # validation groups whose positive and first negative become golden cases


def _step_seed(seed: int, step: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


def _wrap(module: nn.Module, config: TrainConfig, world_size: int) -> nn.Module:
    from ray.train.torch import get_device, prepare_model

    if config.strategy == "fsdp" and world_size > 1:
        from torch.distributed.fsdp import fully_shard

        device = get_device()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        module.to(device)
        # Root-level sharding: PrefixSharedYesNo calls decoder-layer internals directly, so the
        # whole parameter set is gathered for one forward; gradients and optimizer state stay
        # sharded.
        return fully_shard(module)
    return prepare_model(module, parallel_strategy="ddp" if world_size > 1 else None)


class WorkerRun:
    """One worker's part of a run: loads (or restores) the model, then ``fit`` trains it.

    Construct it inside a Ray Train worker. ``scorer`` is the in-memory model being trained
    (its backend's module is the one wrapped for DDP/FSDP), usable for scoring after ``fit``.
    """

    def __init__(self, config: TrainConfig) -> None:
        import ray.train
        from ray.train.torch import get_device

        from acare_ray.scoring import Scorer

        self.config = config
        context = ray.train.get_context()
        self.rank, self.world = context.get_world_rank(), context.get_world_size()
        self.device = get_device()
        self.cpu_bf16 = False
        if self.device.type == "cpu":
            torch.set_num_threads(config.cpus_per_worker)
            self.cpu_bf16 = use_cpu_bf16(config.cpu_bf16)
            if self.rank == 0 and config.cpu_bf16 == "auto":
                log.info(
                    "cpu_bf16 auto: %s",
                    "this CPU has native bf16, training under bf16 autocast"
                    if self.cpu_bf16
                    else "this CPU has no native bf16 (emulated bf16 is many times slower), "
                    "training in float32",
                )

        if self.rank == 0:  # what a killed save left behind; no save is under way yet
            shutil.rmtree(ckpt.staging_root(config.output, config.name), ignore_errors=True)
        self.train, self.val, self.sizes = load_splits(config)
        self.per_epoch = steps_per_epoch(self.sizes, config)
        self.total = total_steps(self.sizes, config)
        self.start_step, self.history, self.resumes, trainer_state = 0, [], [], None
        self.stopped: dict[str, Any] | None = None
        self.optimizer_restarts: list[int] = []
        restored = ray.train.get_checkpoint()
        if restored is not None:
            with restored.as_directory() as directory:
                info = ckpt.read_training_info(directory)
                refuse_other_settings(config, info["config"])
                trainer_state = ckpt.read_trainer_state(directory)
                self.scorer = Scorer.from_settings(
                    directory, config.scorer, device=self.device, dtype=torch.float32
                )
            self.start_step, self.history = info["step"], info["history"]
            self.stopped = info.get("stopped")
            self.resumes = [*info.get("resumes", []), self.start_step]
            self.optimizer_restarts = list(info.get("optimizer_restarts", []))
            if trainer_state is None:
                self.optimizer_restarts.append(self.start_step)
            if self.rank == 0:
                log.info("resuming run %r at step %d", config.name, self.start_step)
        else:
            self.scorer = Scorer.from_settings(
                config.model,
                config.scorer,
                config.revision,
                device=self.device,
                dtype=torch.float32,
            )

        frozen = freeze_lowest(
            self.scorer.backend.hf_model, config.freeze_embeddings, config.freeze_layers
        )
        if frozen and self.rank == 0:
            log.info(
                "frozen: %d parameters (embeddings %s, lowest %d layers)",
                frozen,
                config.freeze_embeddings,
                config.freeze_layers,
            )
        self.module = trainable_module(self.scorer, config.chunk_tokens)
        self.module.train()
        self.model = _wrap(self.module, config, self.world)
        self.optimizer = build_optimizer(self.model, config.lr, config.weight_decay)
        self.scheduler = warmup_linear(
            self.optimizer, warmup_steps(self.total, config.warmup_ratio), self.total
        )
        self.average = self._weight_average(trainer_state)
        if trainer_state is not None:
            ckpt.load_optimizer_state(self.model, self.optimizer, trainer_state["optimizer"])
            self.scheduler.load_state_dict(trainer_state["scheduler"])
        elif self.start_step:
            with warnings.catch_warnings():  # stepping the schedule before any optimizer step
                warnings.simplefilter("ignore", UserWarning)
                for _ in range(self.start_step):
                    self.scheduler.step()
        self.collator = GroupCollator(
            self.scorer.backend,
            config.group_size,
            FieldDropout(config.p_question, config.p_reasoning, config.seed),
        )

    def _weight_average(self, trainer_state: dict[str, Any] | None) -> WeightAverage | None:
        """The moving average of an ``ema_decay`` run. A checkpoint's weights are the average; a
        resumed run takes its trained weights (and update count) from ``trainer_state``, or,
        without them, goes on from the average itself."""
        if self.config.ema_decay is None:
            return None
        saved = (trainer_state or {}).get("weight_average")
        updates = saved["updates"] if saved else self.start_step
        average = WeightAverage(self.module, self.config.ema_decay, updates=updates)
        if saved:
            params = dict(self.module.named_parameters())
            with torch.no_grad():
                for name, weights in saved["trained"].items():
                    params[name].copy_(weights)
        return average

    @contextlib.contextmanager
    def evaluated_weights(self) -> Iterator[dict[str, torch.Tensor] | None]:
        """Inside, the model holds the weights that are validated and saved: the moving average
        with ``ema_decay`` (yielding the trained weights, restored on exit), else the trained
        weights themselves (yielding None)."""
        if self.average is None:
            yield None
            return
        with self.average.applied(self.module) as trained:
            yield trained

    def validation(self) -> dict[str, float]:
        """nDCG@10 per mode on the validation groups (all ranks take part)."""
        if not self.val:
            return {}
        self.module.eval()
        try:
            with ckpt.full_parameters(self.model), self.evaluated_weights():
                return validate(
                    self.scorer,
                    self.val,
                    self.config.eval_modes,
                    self.rank,
                    self.world,
                    self.config.temperature,
                )
        finally:
            self.module.train()

    def fit(self) -> list[dict[str, Any]]:
        """Train from ``start_step`` to the last step; returns the metric history. Afterwards
        the in-memory model holds the weights of the last checkpoint (with ``ema_decay``, the
        average)."""
        import ray.train

        config = self.config
        # A run restored from its step-0 checkpoint has validated step 0 already (its history
        # says so): validating and saving again would register checkpoint_0000000 twice.
        if self.start_step == 0 and config.eval_at_start and not self.history:
            metrics = {"step": 0, "elapsed_s": 0.0, **self.validation()}
            self.history.append(metrics)
            if config.select_metric is not None:
                self.require_metric(metrics)
                self.save_and_report(metrics)  # the untrained model is a candidate too
            else:
                ray.train.report(metrics)
            if self.rank == 0:
                log.info("step 0: %s", metrics)
        if self.should_stop():
            return self._finish()

        losses, started = [], time.perf_counter()
        elapsed_before = float(self.history[-1].get("elapsed_s", 0.0)) if self.history else 0.0
        for step in range(self.start_step, self.total):
            epoch = step // self.per_epoch
            torch.manual_seed(_step_seed(config.seed, step, self.rank))
            batches = [
                self.collator([self.train[i] for i in part], epoch)
                for part in step_groups(self.sizes, config, step, self.rank)
            ]
            stats = train_step(
                self.model,
                batches,
                self.optimizer,
                self.scheduler,
                group_size=config.group_size,
                temperature=config.temperature,
                max_grad_norm=config.max_grad_norm,
                device=self.device,
                cpu_bf16=self.cpu_bf16,
            )
            if self.average is not None:
                self.average.update(self.module)
            losses.append(stats.loss)
            done = step + 1
            if self.rank == 0 and (done % config.log_every == 0 or done == self.total):
                log.info(
                    "step %d/%d epoch %d loss %.4f lr %.2e grad_norm %.3f (%.2f s/step)",
                    done,
                    self.total,
                    epoch,
                    float(np.mean(losses[-config.log_every :])),
                    stats.lr,
                    stats.grad_norm,
                    (time.perf_counter() - started) / (done - self.start_step),
                )
            elapsed = elapsed_before + time.perf_counter() - started
            out_of_time = config.time_budget_s is not None and _any_rank(
                elapsed >= config.time_budget_s, self.world, self.device
            )
            if done % config.checkpoint_every == 0 or done == self.total or out_of_time:
                metrics = {
                    "step": done,
                    "epoch": epoch,
                    "loss": _mean_over_ranks(float(np.mean(losses)), self.world, self.device),
                    "lr": stats.lr,
                    "elapsed_s": elapsed,
                    **self.validation(),
                }
                losses = []
                self.history.append(metrics)
                if out_of_time:
                    self.stopped = {"reason": "time budget", "step": done}
                stop = self.should_stop()  # decided before the save, which records it
                self.save_and_report(metrics)
                if stop:
                    break
        return self._finish()

    def _finish(self) -> list[dict[str, Any]]:
        if self.average is not None:
            self.average.load_into(self.module)
        self.module.eval()
        return self.history

    def golden_record(self) -> dict[str, Any] | None:
        """Golden scores of the weights being saved (:mod:`acare_ray.scoring.golden`): the
        synthetic cases and the positive and first negative of a few validation groups, scored
        in memory without dropout, so a loaded checkpoint can prove it scores the same. None on
        a sharded model (its full weights exist only while gathered)."""
        from acare_ray.scoring.golden import record

        if ckpt.is_sharded(self.model):
            return None
        items = []
        for group in self.val[:GOLDEN_GROUPS]:
            mode = group.context.resolve_mode("auto")
            items += [(group.context, d.text, mode) for d in (group.positive, group.negatives[0])]
        self.module.eval()
        try:
            with torch.no_grad():
                return record(self.scorer, items)
        finally:
            self.module.train()

    def require_metric(self, metrics: dict[str, Any]) -> None:
        """ValueError when the validation does not measure ``select_metric`` (no validation
        groups, or none with the fields its mode needs)."""
        if self.config.select_metric not in metrics:
            raise ValueError(
                f"select_metric {self.config.select_metric!r} was not measured: the validation "
                f"gave {sorted(k for k in metrics if k.startswith('val/'))} (give validation "
                "groups whose context has the fields of that mode)"
            )

    def should_stop(self) -> bool:
        """True once the run is over before its last step: out of time or stopped in an earlier
        launch (``stopped`` already set), or early stopping on the selected metric by the
        history so far (which then sets ``stopped``)."""
        if self.stopped is not None:
            return True
        config = self.config
        if config.select_metric is None or config.patience is None:
            return False
        chosen = selection(self.history, config.select_metric, config.patience, config.min_delta)
        if chosen is None or not chosen.stop:
            return False
        self.stopped = {"reason": "early stopping", "step": self.history[-1]["step"]}
        if self.rank == 0:
            log.info(
                "early stopping at step %d: %s best %.4f at step %d, %d validations without "
                "improvement",
                self.history[-1]["step"],
                config.select_metric,
                chosen.best_value,
                chosen.best_step,
                chosen.stale,
            )
        return True

    def save_and_report(self, metrics: dict[str, Any]) -> None:
        """Rank 0 writes a checkpoint of the evaluated weights (:meth:`evaluated_weights`);
        every rank reports ``metrics``."""
        with self.evaluated_weights() as trained:
            self._save_and_report(metrics, trained)

    def _save_and_report(
        self, metrics: dict[str, Any], trained: dict[str, torch.Tensor] | None
    ) -> None:
        import ray.train

        optimizer_state = ckpt.optimizer_state(self.model, self.optimizer)
        sharded = ckpt.is_sharded(self.model)
        model_state = ckpt.full_model_state(self.model) if sharded else None
        step = metrics["step"]
        name = f"checkpoint_{step:07d}"
        staged = ckpt.staging_root(self.config.output, self.config.name) / f"rank{self.rank}-{name}"
        checkpoint = None
        config = self.config
        chosen = None
        if config.select_metric is not None:
            chosen = selection(
                self.history, config.select_metric, config.patience, config.min_delta
            )
            # Ray Train keeps the checkpoints with the highest score: a checkpoint's score is its
            # step when it is the best at its report, else -1, so the kept one is the current
            # best under this rule (min_delta and ties included), whatever the raw metric says.
            best_here = chosen is not None and chosen.best_step == step
            metrics = {**metrics, SELECTION_SCORE: step if best_here else -1}
        try:
            if self.rank == 0:
                info = {
                    "step": step,
                    "config": config.to_dict(),
                    "history": self.history,
                    "resumes": self.resumes,
                    "optimizer_restarts": self.optimizer_restarts,
                    "stopped": self.stopped,
                }
                if chosen is not None:
                    info["selection"] = {"metric": config.select_metric, **chosen.as_dict()}
                state = {"optimizer": optimizer_state, "scheduler": self.scheduler.state_dict()}
                if trained is not None:
                    state["weight_average"] = {"updates": self.average.updates, "trained": trained}
                ckpt.write_checkpoint(
                    staged,
                    self.scorer,
                    info=info,
                    trainer_state=state,
                    model_state=model_state,
                    golden=self.golden_record(),
                )
                checkpoint = ray.train.Checkpoint.from_directory(str(staged))
            ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        if self.rank == 0:
            log.info("step %d: checkpoint saved, %s", step, metrics)


def train_loop_per_worker(loop_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The function ``TorchTrainer`` runs on each worker; returns the metric history."""
    _log_to_stderr()
    return WorkerRun(TrainConfig.from_dict(loop_config["config"])).fit()


def _mean_over_ranks(value: float, world_size: int, device: torch.device) -> float:
    if world_size == 1:
        return value
    import torch.distributed as dist

    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return float(total) / world_size


def _any_rank(flag: bool, world_size: int, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on any (a decision all workers take together)."""
    if world_size == 1:
        return flag
    import torch.distributed as dist

    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def _log_to_stderr() -> None:
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _absolute(path: str | None) -> str | None:
    if path is None:
        return None
    resolved = Path(path).expanduser()
    return str(resolved.resolve()) if resolved.exists() else path


def run(config: TrainConfig) -> Path:
    """Run (or resume) the training job; returns the final checkpoint's directory.

    Connects to ``config.ray_address`` or starts/joins a local Ray instance. Paths are made
    absolute first, since workers do not share the caller's working directory. Raises
    ``ray.train.TrainingFailedError`` (wrapping the worker's error) if training fails.
    """
    import ray

    config = replace(
        config,
        data=_absolute(config.data)
        if isinstance(config.data, str)
        else tuple(_absolute(p) for p in config.data),
        val_data=_absolute(config.val_data),
        model=_absolute(config.model),
        # Ray Train reads a run folder as a URI: a relative one has no scheme
        output=str(Path(config.output).expanduser().resolve()),
    )
    Path(config.output).mkdir(parents=True, exist_ok=True)
    saved = saved_run_config(config)
    if saved is not None:  # refused here, before any worker starts (the workers check again)
        refuse_other_settings(config, saved)
        finished = finished_checkpoint(config)
        if finished is not None:
            log.info("run %r has finished: its final checkpoint is %s", config.name, finished)
            return finished
    if not ray.is_initialized():
        if config.ray_address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=config.ray_address, log_to_driver=True)
        else:
            start_local_ray()
    result = build_trainer(config).fit()
    if result.checkpoint is None:
        raise RuntimeError(f"run {config.name!r} finished without a checkpoint")
    return selected_checkpoint(config, Path(result.checkpoint.path))


def selected_checkpoint(config: TrainConfig, latest: Path) -> Path:
    """The run's result: with ``select_metric`` its best validated checkpoint (as the latest
    checkpoint's ``training.json`` names it), else ``latest``."""
    if config.select_metric is None:
        return latest
    chosen = ckpt.read_training_info(latest).get("selection")
    if not chosen:
        return latest
    best = latest.parent / f"checkpoint_{chosen['best_step']:07d}"
    if not best.is_dir():
        raise RuntimeError(
            f"run {config.name!r}: the best checkpoint {best.name} ({chosen['metric']} "
            f"{chosen['best_value']:.4f}) is gone; keep_checkpoints keeps the best by that metric"
        )
    return best


def refuse_other_settings(config: TrainConfig, saved: dict[str, Any]) -> None:
    """ValueError naming each setting of ``config`` that differs from a saved run's ``saved``
    settings in a way that would change its data order (resuming it would not be that run)."""
    mismatches = config.resume_mismatches(saved)
    if mismatches:
        raise ValueError(
            f"run {config.name!r} exists with other settings and cannot be resumed "
            f"(use a new name): {'; '.join(mismatches)}"
        )


def finished_checkpoint(config: TrainConfig) -> Path | None:
    """The final checkpoint of the run ``config`` names when that run has reached its last step
    (the newest checkpoint Ray Train registered, as ``Result.from_path`` reads it), so a relaunch
    returns it without starting a cluster or a worker group; None when there is more to train."""
    from ray.train import Result

    try:
        checkpoint = Result.from_path(str(ckpt.run_dir(config.output, config.name))).checkpoint
    except RuntimeError:  # no checkpoint registered yet
        return None
    if checkpoint is None:
        return None
    path = Path(checkpoint.path)
    info = ckpt.read_training_info(path)
    if info.get("stopped"):
        return selected_checkpoint(config, path)
    _, _, sizes = load_splits(config)
    return selected_checkpoint(config, path) if info["step"] >= total_steps(sizes, config) else None


def saved_run_config(config: TrainConfig) -> dict[str, Any] | None:
    """The settings saved with the newest checkpoint of the run ``config`` names (its output
    folder and name); None when the run has no checkpoint yet."""
    folder = ckpt.run_dir(config.output, config.name)
    for checkpoint in sorted(folder.glob("checkpoint_*"), reverse=True):
        if (checkpoint / ckpt.TRAINING_FILE).is_file():
            return ckpt.read_training_info(checkpoint)["config"]
    return None


def start_local_ray(num_cpus: int | None = None, **init_kwargs: Any) -> str:
    """Start a local Ray instance (with its own dashboard) that knows its own address.

    Ray Train V2 launches a detached placement-group cleaner that asks the state API (served
    by the dashboard) whether the run's controller is alive. A cluster without a dashboard
    still advertises the default ``127.0.0.1:8265``, and auto-detection may pick another
    cluster; on a host running several Ray instances the cleaner then asks another cluster,
    does not find the controller, and removes the placement group of a live run (its workers
    die with "placement group was removed"). So: a dashboard on a free port, a pinned GCS port,
    and the address in every job process's ``RAY_ADDRESS``. Returns the GCS address.
    """
    import ray

    port, dashboard_port = _free_port(), _free_port()
    address = f"{ray.util.get_node_ip_address()}:{port}"
    runtime_env = dict(init_kwargs.pop("runtime_env", None) or {})
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), "RAY_ADDRESS": address}
    init_kwargs.setdefault("include_dashboard", True)
    init_kwargs.setdefault("dashboard_port", dashboard_port)
    os.environ["RAY_GCS_SERVER_PORT"] = str(port)
    try:
        ray.init(num_cpus=num_cpus, runtime_env=runtime_env, **init_kwargs)
    finally:
        del os.environ["RAY_GCS_SERVER_PORT"]
    actual = ray.get_runtime_context().gcs_address
    if actual != address:
        log.warning("Ray started at %s, not the pinned %s", actual, address)
    return actual


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def build_trainer(
    config: TrainConfig, train_fn: Callable[[dict[str, Any]], Any] = train_loop_per_worker
) -> Any:
    """The ``TorchTrainer`` of a run (``run`` fits it; tests may pass their own ``train_fn``)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    storage = str(Path(config.output).expanduser().resolve())
    config = replace(config, output=storage)  # workers stage checkpoints under it
    resources: dict[str, float] = {"CPU": config.cpus_per_worker}
    if config.use_gpu:
        resources["GPU"] = config.gpus_per_worker
    return TorchTrainer(
        train_fn,
        train_loop_config={"config": config.to_dict()},
        scaling_config=ScalingConfig(
            num_workers=config.workers,
            use_gpu=config.use_gpu,
            resources_per_worker=resources,
        ),
        run_config=RunConfig(
            name=config.name,
            storage_path=storage,
            checkpoint_config=CheckpointConfig(
                num_to_keep=config.keep_checkpoints,
                # the best by the selection rule are kept (Ray Train always keeps the latest)
                checkpoint_score_attribute=SELECTION_SCORE if config.select_metric else None,
            ),
            failure_config=FailureConfig(max_failures=config.max_failures),
        ),
    )
