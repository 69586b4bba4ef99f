"""Behaviour cloning / DAgger training of the student on trainable labels only.

The trainer sees nothing but a LabelBuffer (hg_dagger.learn.aggregate), which holds only rows whose
label mask is TRAINABLE with their label target; so invalid expert outputs and non-trainable rows
cannot reach the loss. The loss is the mean squared error in the normalized policy action space (a GMM
head's negative log-likelihood there, ``kind: mlp_gmm``; a chunk head's error over the next steps of the
row's label segment, ``kind: mlp_chunk``),
each ensemble member seeing its own bootstrap weights over a shared batch, optionally
upweighting correction rows (IWR-style, ``LabelBufferConfig.intervention_weight``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from tqdm import tqdm

from hg_dagger.contract import TrainingBlock
from hg_dagger.contract.model import StrictModel
from hg_dagger.datasets.read import episode_labels
from hg_dagger.datasets.repository import default_root, load, record_training, root_of
from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError, ContractError
from hg_dagger.learn.aggregate import LabelBuffer, LabelBufferConfig, held_out
from hg_dagger.learn.gate_calibration import calibrate_student
from hg_dagger.policy import Student
from hg_dagger.policy.checkpoint import read_checkpoint, save_checkpoint
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import load_labels, selection

log = logging.getLogger(__name__)


class StudentConfig(StrictModel):
    kind: str = "mlp"
    ensemble: int = Field(default=5, ge=1)
    hidden: tuple[int, ...] = (256, 256)


class TrainConfig(StrictModel):
    steps: int = Field(default=2000, gt=0, description="gradient steps per training round")
    batch_size: int = Field(default=256, gt=0)
    lr: float = Field(default=1e-3, gt=0)
    lr_schedule: Literal["constant", "cosine"] = Field(
        default="cosine", description="per round: constant lr, or cosine decay from lr to lr_min over the round's steps")
    lr_min: float = Field(default=1e-5, ge=0)
    warm_start: bool = Field(default=True, description="each round continues from the last weights; False: re-init")
    steps_per_label: float | None = Field(
        default=None, gt=0, description="instead of `steps`: a round's budget is this many gradient steps per label "
        "in the replay; with warm_start false each round trains the whole budget from fresh weights, with warm start "
        "the part of it not trained yet")
    weight_decay: float = Field(default=1e-5, ge=0)
    bootstrap: bool = True  # per-member Poisson(1) weights: ensemble diversity from one batch
    log_every: int = Field(default=50, gt=0)
    seed: int = 0
    threads: int = Field(default=1, ge=1, description="torch CPU threads while training")


def lr_at(cfg: TrainConfig, step: int, steps: int) -> float:
    """Learning rate of a round's step: a round that ends at a small lr ends on a settled policy."""
    if cfg.lr_schedule == "constant" or steps <= 1:
        return cfg.lr
    return cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1.0 + math.cos(math.pi * step / (steps - 1)))


class AdamW:
    """Adam with decoupled weight decay, in a few tensor ops.

    torch.optim imports the torch compiler stack on first use (seconds of start-up in every process,
    over ten on a loaded machine); the student's few parameter tensors do not need it.
    """

    def __init__(self, params, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.weight_decay, self.betas, self.eps = float(lr), float(weight_decay), tuple(betas), float(eps)
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            if self.weight_decay:
                p.mul_(1 - self.lr * self.weight_decay)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "m": [m.clone() for m in self.m], "v": [v.clone() for v in self.v],
                "lr": self.lr, "weight_decay": self.weight_decay, "betas": list(self.betas), "eps": self.eps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["m"]) != len(self.params):
            raise ConfigError(f"optimizer state has {len(state['m'])} tensors, the student has {len(self.params)}")
        self.t = int(state["t"])
        for dst, src in zip(self.m + self.v, list(state["m"]) + list(state["v"]), strict=True):
            dst.copy_(src)


class Trainer:
    """Owns the optimizer and the training-side state a checkpoint must carry to resume."""

    def __init__(self, student: Student, config: TrainConfig, replay: LabelBuffer):
        self.student = student
        self.config = config
        self.replay = replay
        self.optimizer = AdamW(student.net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.iteration = 0  # completed DAgger iterations (set by the caller)
        self.beta: float | None = None
        self.total_steps = 0
        self._rng = np.random.default_rng(config.seed)
        self._gen = torch.Generator().manual_seed(config.seed)

    # ------------------------------------------------------------------ data

    def _tensors(self) -> dict[str, Any]:
        a = self.replay.arrays()
        m = self.student.mapping
        state = np.asarray(m.flatten_obs(a["obs"]), dtype=np.float32)
        target = np.asarray(m.raw_to_policy(a["target"]), dtype=np.float32)
        horizon = self.student.net.horizon
        idx, valid = self.replay.chunk_rows(horizon) if horizon > 1 else (None, None)
        return {
            "state": torch.from_numpy(np.ascontiguousarray(state)),
            "target": torch.from_numpy(np.ascontiguousarray(target)),
            "images": {k: torch.from_numpy(a["obs"][k]) for k in self.student.spec.image_keys},
            "weight": torch.from_numpy(a["weight"]),
            "chunk_rows": None if idx is None else torch.from_numpy(idx),
            "chunk_valid": None if valid is None else torch.from_numpy(valid),
        }

    # ------------------------------------------------------------------ training

    def fit(
        self,
        steps: int | None = None,
        *,
        log_path: str | Path | None = None,
        progress: bool = True,
        info: dict[str, Any] | None = None,
        on_batch: Callable[[np.ndarray], None] | None = None,
    ) -> dict[str, Any]:
        """One training round on the current replay; returns loss figures and the new policy version."""
        cfg = self.config
        steps = int(steps or self.round_steps())
        threads = torch.get_num_threads()
        torch.set_num_threads(cfg.threads)
        try:
            return self._fit(steps, log_path, progress, info or {}, on_batch)
        finally:
            torch.set_num_threads(threads)

    def round_steps(self) -> int:
        """Gradient steps the next round trains: ``steps``, or the per-label budget over the current replay (at
        least one step, so every round ends on a new policy version)."""
        cfg = self.config
        if cfg.steps_per_label is None:
            return cfg.steps
        budget = round(cfg.steps_per_label * len(self.replay))
        return max(1, budget if not cfg.warm_start else budget - self.total_steps)

    def _fit(self, steps, log_path, progress, info, on_batch) -> dict[str, Any]:
        cfg, student = self.config, self.student
        if not cfg.warm_start and student.round > 0:
            student.reset_weights(student.seed + student.round)
            self.optimizer = AdamW(student.net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        data = self._tensors()
        student.set_normalization(data["state"].numpy(), data["target"].numpy())
        if data["chunk_valid"] is not None:  # how far ahead these labels supervise a chunk (its ensembling trusts that)
            student.net.chunk_coverage.copy_(data["chunk_valid"].float().mean(0))
        net = student.net
        act_mean, act_std = net.act_mean, net.act_std
        z_target = (data["target"] - act_mean) / act_std
        k = student.spec.ensemble
        log_file = open(log_path, "a") if log_path else None  # noqa: SIM115 - closed below
        t0 = time.perf_counter()
        net.train()
        losses: list[float] = []
        try:
            bar = tqdm(range(steps), desc=f"train round {student.round + 1}", disable=not progress, leave=False)
            for i in bar:
                self.optimizer.lr = lr_at(cfg, i, steps)
                rows = self.replay.sample(cfg.batch_size, self._rng)
                if on_batch is not None:
                    on_batch(rows)
                idx = torch.from_numpy(rows)
                images = {key: v[idx] for key, v in data["images"].items()}
                if data["chunk_rows"] is None:
                    err = net.member_loss(data["state"][idx], images, z_target[idx])  # [K, B]: MSE, or a GMM's NLL
                else:  # a chunk head: the next steps of the row's segment, padding masked
                    ahead = data["chunk_rows"][idx]
                    err = net.member_loss(data["state"][idx], images, z_target[ahead], data["chunk_valid"][idx])
                w = data["weight"][idx].unsqueeze(0).expand(k, -1)
                if cfg.bootstrap and k > 1:
                    w = w * torch.poisson(torch.ones(k, len(rows)), generator=self._gen)
                loss = (err * w).sum() / w.sum().clamp(min=1e-6)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                self.total_steps += 1
                value = float(loss.detach())
                losses.append(value)
                if self.total_steps % cfg.log_every == 0:
                    bar.set_postfix(loss=f"{value:.4f}")
                    if log_file:
                        rec = {"round": student.round + 1, "step": self.total_steps, "loss": value,
                               "labels": len(self.replay), "iteration": self.iteration}
                        log_file.write(json.dumps(rec) + "\n")
        finally:
            net.eval()
            if log_file:
                log_file.close()
        n = min(len(data["state"]), 4096)
        sel = np.linspace(0, len(data["state"]) - 1, n).astype(np.int64)
        a = self.replay.arrays()
        student.calibrate_confidence({key: v[sel] for key, v in a["obs"].items()})
        version = student.finish_round({
            "iteration": self.iteration, "steps": steps, "labels": len(self.replay),
            "episodes": self.replay.num_episodes, "final_loss": float(np.mean(losses[-20:])) if losses else None,
            **info,
        })
        return {
            "version": version, "round": student.round, "steps": steps,
            "loss_first": losses[0] if losses else None, "loss_last": float(np.mean(losses[-20:])) if losses else None,
            "seconds": time.perf_counter() - t0, "labels": len(self.replay),
        }

    # ------------------------------------------------------------------ checkpoint / resume

    def state(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "iteration": self.iteration,
            "beta": self.beta,
            "total_steps": self.total_steps,
            "rng": json.dumps(self._rng.bit_generator.state),
            "torch_rng": self._gen.get_state(),
            "replay": self.replay.state(),
            "config": self.config.model_dump(),
        }

    def save(self, path: str | Path, **extra: Any) -> Path:
        return save_checkpoint(path, self.student, train=self.state(), **extra)

    @classmethod
    def resume(cls, path: str | Path, mapping, loader: Callable[[str], Any], config: TrainConfig | None = None) -> Trainer:
        """Rebuild student, optimizer, iteration, beta, RNGs and replay from a checkpoint."""
        data = read_checkpoint(path)
        train = data["extra"].get("train")
        if train is None:
            raise ConfigError(f"{path}: a policy-only checkpoint; it holds no training state to resume from")
        student = Student.load(path, mapping)
        cfg = config or TrainConfig.model_validate(train["config"])
        replay = LabelBuffer(LabelBufferConfig.model_validate(train["replay"]["config"]))
        replay.restore(train["replay"], loader)
        trainer = cls(student, cfg, replay)
        trainer.optimizer.load_state_dict(train["optimizer"])
        trainer.iteration = int(train["iteration"])
        trainer.beta = train["beta"]
        trainer.total_steps = int(train["total_steps"])
        bg = np.random.PCG64()
        bg.state = json.loads(train["rng"])
        trainer._rng = np.random.Generator(bg)
        trainer._gen.set_state(train["torch_rng"])
        return trainer


# ---------------------------------------------------------------------- store -> replay


def training_episodes(store, mapping, *, holdout_fraction: float = 0.0, held: bool = False) -> list:
    """Complete episodes of this task usable for training (or, with held=True, the held-out ones)."""
    out = []
    for info in store.episodes():
        if not info.complete or info.end is None or info.start.task.task_id != mapping.task_id:
            continue
        if info.start.mapping_hash and info.start.mapping_hash != mapping.hash:
            raise ContractError(f"episode {info.episode_id}: recorded under mapping hash {info.start.mapping_hash}, "
                                f"task {mapping.task_id} now has {mapping.hash}; re-record or train with that mapping")
        if held_out(info.episode_id, info.start.split, holdout_fraction) == held:
            out.append(info)
    return out


def selection_summary(store, episodes, rule) -> dict[str, Any]:
    """Labels of ``episodes`` that pass the training boundary and what stopped the rest, with the rule used."""
    total: dict[str, Any] = {"labels": 0, "allowed": 0, **{str(b.name).lower(): 0 for b in TrainingBlock}}
    for info in episodes:
        for k, v in selection(store, info, rule).counts().items():
            total[k] = total.get(k, 0) + v
    total["rule"] = rule.model_dump()
    return total


def describe_selection(counts: dict[str, Any]) -> str:
    """'120 of 300 labels allowed; 150 not_reviewed, 30 qc_not_run' from selection_summary."""
    stops = [f"{counts[str(b.name).lower()]} {str(b.name).lower()}" for b in TrainingBlock if counts.get(str(b.name).lower())]
    text = f"{counts.get('allowed', 0)} of {counts.get('labels', 0)} labels allowed"
    return text + (f"; stopped: {', '.join(stops)}" if stops else "")


def store_loader(store, mapping, rule=None) -> Callable[[str], Any]:
    keys = list(mapping.obs_spec())
    by_id: dict[str, Any] = {}

    def load(episode_id: str):
        if not by_id:
            by_id.update({i.episode_id: i for i in store.episodes()})
        if episode_id not in by_id:
            raise ContractError(f"episode {episode_id}: listed in the checkpoint's replay state but not in the store")
        return load_labels(store, by_id[episode_id], keys, rule)

    return load


def train_from_store(
    store_url: str | None,
    task: str,
    out_dir: str | Path,
    *,
    student_cfg: StudentConfig | None = None,
    train_cfg: TrainConfig | None = None,
    replay_cfg: LabelBufferConfig | None = None,
    resume: str | Path | None = None,
    progress: bool = True,
    on_step: Callable[[int, int], None] | None = None,
    warm_start: str | Path | None = None,
    dataset: str | None = None,
    datasets_root: str | Path | None = None,
) -> dict[str, Any]:
    """`hg-dagger train`: all trainable labels of a task in a store -> a student checkpoint.

    ``resume`` continues a training run (its optimizer and replay, whose episodes must be in this store);
    ``warm_start`` starts from a student checkpoint's weights and round, wherever it was trained, with
    a fresh optimizer and this store's labels (the next round of a live session).
    ``dataset`` ('NAME@vN' under ``datasets_root``, default the folder beside the store, or a manifest file)
    trains on exactly that version's trainable samples instead, read from the label layers it names.
    ``on_step(done, total)`` is called after every gradient step (progress for a front end)."""
    mapping = load_mapping(task)
    if dataset is not None:
        return _train_on_dataset(dataset, datasets_root, store_url, task, mapping, out_dir,
                                 student_cfg=student_cfg, train_cfg=train_cfg, replay_cfg=replay_cfg, resume=resume,
                                 progress=progress, on_step=on_step, warm_start=warm_start)
    if store_url is None:
        raise ConfigError("train needs --store (or --dataset NAME@vN)")
    store = EpisodeStore.open(store_url, mode="r")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    replay_cfg = replay_cfg or LabelBufferConfig()
    loader = store_loader(store, mapping, replay_cfg.authorization)
    if resume and warm_start:
        raise ConfigError("give resume (continue a training run) or warm_start (start from a student), not both")
    if resume:
        trainer = Trainer.resume(resume, mapping, loader, train_cfg)
    elif warm_start:
        seed = (train_cfg or TrainConfig()).seed
        trainer = Trainer(Student.load(warm_start, mapping), train_cfg or TrainConfig(), LabelBuffer(replay_cfg, seed=seed))
    else:
        sc = student_cfg or StudentConfig()
        student = Student.create(mapping, kind=sc.kind, ensemble=sc.ensemble, hidden=sc.hidden,
                                 seed=(train_cfg or TrainConfig()).seed)
        trainer = Trainer(student, train_cfg or TrainConfig(), LabelBuffer(replay_cfg, seed=(train_cfg or TrainConfig()).seed))
    episodes = training_episodes(store, mapping, holdout_fraction=trainer.replay.config.holdout_fraction)
    keys = list(mapping.obs_spec())
    rule = trainer.replay.config.authorization
    if not episodes:
        raise ContractError(f"{store_url}: no episode of task {mapping.task_id} to train on ({_episodes_note(store)})")
    selected = selection_summary(store, episodes, rule)
    if selected["allowed"] == 0:
        raise ContractError(f"{store_url}: no label of task {mapping.task_id} may be trained on yet "
                            f"({describe_selection(selected)}); see `hg-dagger report {store_url}`")
    trainer.replay.add(load_labels(store, info, keys, rule) for info in
                       tqdm(episodes, desc="load labels", disable=not progress, leave=False))
    total = trainer.config.steps
    counter = iter(range(1, total + 1))
    on_batch = None if on_step is None else (lambda _rows: on_step(next(counter), total))
    result = trainer.fit(log_path=out / "loss.jsonl", progress=progress, info={"store": str(store_url)},
                         on_batch=on_batch)
    ckpt = trainer.save(out / "student.pt")
    result.update(checkpoint=str(ckpt), replay=trainer.replay.summary(), selection=selected)
    result["gate_calibration"] = calibrate_student(str(store_url), str(ckpt), task)  # the student's own gate
    (out / "train.json").write_text(json.dumps(result, indent=2))
    return result


def _episodes_note(store) -> str:
    """What the store holds instead: "the store holds no episode", or counts of complete episodes per task."""
    infos = store.episodes()
    if not infos:
        return "the store holds no episode"
    tasks = Counter(i.task_id for i in infos if i.complete)
    incomplete = sum(not i.complete for i in infos)
    parts = [f"{n} of {t}" for t, n in sorted(tasks.items())] + ([f"{incomplete} incomplete"] if incomplete else [])
    return "complete episodes held out or of other tasks; the store holds " + ", ".join(parts)


def _new_trainer(mapping, student_cfg, train_cfg, replay_cfg, resume, warm_start, loader) -> Trainer:
    if resume and warm_start:
        raise ConfigError("give resume (continue a training run) or warm_start (start from a student), not both")
    tc = train_cfg or TrainConfig()
    if resume:
        return Trainer.resume(resume, mapping, loader, train_cfg)
    if warm_start:
        return Trainer(Student.load(warm_start, mapping), tc, LabelBuffer(replay_cfg, seed=tc.seed))
    sc = student_cfg or StudentConfig()
    student = Student.create(mapping, kind=sc.kind, ensemble=sc.ensemble, hidden=sc.hidden, seed=tc.seed)
    return Trainer(student, tc, LabelBuffer(replay_cfg, seed=tc.seed))


def _train_on_dataset(ref, root, store_url, task, mapping, out_dir, *, student_cfg, train_cfg, replay_cfg, resume,
                      progress, on_step, warm_start) -> dict[str, Any]:
    """`train --dataset NAME@vN`: exactly the version's trainable samples (hg_dagger.datasets.read), each
    re-checked on the label layer it names (an authorization that counts for nothing now - its operator's own,
    or by a reviewer off the roster - stops training in one line, ``read.refuse_void``); the dataset version is
    recorded in train.json, in the checkpoint and beside the manifest, and the student's calibrated gate
    thresholds are stored with it as `train --store` stores them (``_calibrate``)."""
    root = root_of(ref) if root is None and store_url is None and str(ref).endswith(".json") else \
        default_root(root, [store_url] if store_url else [])
    manifest = load(root, ref)
    keys = list(mapping.obs_spec())
    labels = episode_labels(manifest, keys, task=mapping.task_id, mapping_hash=mapping.hash)
    by_id = {e.episode_id: e for e in labels}
    replay_cfg = (replay_cfg or LabelBufferConfig()).model_copy(update={"authorization": manifest.config.selection.rule})

    def loader(episode_id: str):
        if episode_id not in by_id:
            raise ContractError(f"episode {episode_id}: listed in the checkpoint's replay state but not a trainable "
                                f"sample of {manifest.ref}")
        return by_id[episode_id]

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trainer = _new_trainer(mapping, student_cfg, train_cfg, replay_cfg, resume, warm_start, loader)
    n_labels = sum(len(e) for e in labels)
    selected = {"dataset": manifest.ref, "labels": n_labels, "allowed": n_labels,
                "samples": len(manifest.by_usage("trainable")), "rule": manifest.config.selection.rule.model_dump()}
    if n_labels == 0:
        raise ContractError(f"{manifest.ref}: no trainable sample of task {mapping.task_id} "
                            f"({manifest.summary.get('usage')}); see `hg-dagger dataset show {manifest.ref}`")
    trainer.replay.add(labels)
    total = trainer.config.steps
    counter = iter(range(1, total + 1))
    on_batch = None if on_step is None else (lambda _rows: on_step(next(counter), total))
    info = {"dataset": manifest.ref, "dataset_hash": manifest.hash}
    result = trainer.fit(log_path=out / "loss.jsonl", progress=progress, info=info, on_batch=on_batch)
    ckpt = trainer.save(out / "student.pt", dataset=info)
    record_training(root, manifest, result["version"], str(ckpt))
    result.update(checkpoint=str(ckpt), replay=trainer.replay.summary(), selection=selected,
                  dataset={"name": manifest.name, "version": manifest.version, "ref": manifest.ref,
                           "hash": manifest.hash, "root": str(root)})
    stores = [str(store_url)] if store_url else [s.url for s in reversed(manifest.stores)]
    result["gate_calibration"] = _calibrate(stores, str(ckpt), task)  # the student's own gate, as with --store
    (out / "train.json").write_text(json.dumps(result, indent=2))
    return result


def _calibrate(stores: list[str], checkpoint: str, task: str) -> dict[str, Any]:
    """``calibrate_student`` on the first of ``stores`` whose recorded states calibrate the student's gate (`train
    --dataset`: the store given, else the version's stores, the newest first); what it stored, and where from."""
    result: dict[str, Any] = {"thresholds": None, "message": "no store to calibrate the confidence gate on"}
    for url in stores:
        result = {**calibrate_student(url, checkpoint, task), "store": url}
        if result["thresholds"]:
            break
    return result
