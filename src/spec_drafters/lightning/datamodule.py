"""The LightningDataModule: a run's records (data/records.py), online or from an offline feature
cache (data/feature_cache.py), in the epoch order a resumed run continues exactly."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from spec_drafters.data.feature_cache import CachedRecords, collate_cached, run_meta
from spec_drafters.data.records import EpochShuffle, TextRecords, collate


class TextDataModule(TextRecords, pl.LightningDataModule):
    """Tokenizes with the target's tokenizer (the LightningModule's, at ``setup``); the arguments are
    TextRecords', whose ``__init__`` also runs LightningDataModule's (cooperative ``super()``).

    """

    def setup(self, stage: str) -> None:
        if self.train or self.val:
            return
        spec = self.trainer.lightning_module.feature_spec()
        self.train, self.val = self.examples(spec.tokenizer)
        if self.cache:  # the records are tokenized all the same: the cache must have been built from them
            expect = run_meta(spec, self, self.train)
            if spec.soft:  # soft losses read the cached label hidden state
                expect["label_hidden"] = True
            self.train = CachedRecords(self.cache, expect, examples=self.train)
            self.notes += [*self.train.notes, f"train: {len(self.train)} cached records from {self.cache}"]
        for note in self.notes:
            rank_zero_info(note)
        self.notes = []

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        sampler = EpochShuffle(len(self.train), self.seed, self.batch_size, world, rank)
        loop = trainer.fit_loop if trainer is not None else None
        if loop is not None and loop.restarting:  # resuming mid-epoch: skip what was trained on
            # "processed": batches whose training step ran (a checkpoint written in on_train_batch_end
            # counts its own batch as processed but not yet completed).
            sampler.resume_at(trainer.current_epoch, loop.epoch_loop.batch_progress.current.processed)
            # Lightning then warns that a mid-epoch resume is unreliable unless the DataLoader has a
            # state_dict; this one needs none (tests/test_resume.py: the losses match step for step).
            # Set here, per fit, not at import: a caller's catch_warnings (pytest's) would drop it.
            warnings.filterwarnings("ignore", message=r"You.re resuming from a checkpoint that ended before")
        collate_fn = collate_cached if self.cache else collate
        return DataLoader(self.train, batch_size=self.batch_size, sampler=sampler, collate_fn=collate_fn)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.val_batch_size, shuffle=False, collate_fn=collate)

    # --- resuming -----------------------------------------------------------------------------------
    #: The settings a resumed run must share with the saved one to continue it exactly (the records,
    #: their tokens, the epoch order and the position in it, which counts batches).
    RESUMED = ("path", "cache", "max_length", "batch_size", "max_train_records", "seed")

    def _resumed(self) -> dict:
        out = {key: getattr(self, key) for key in self.RESUMED}
        for key in ("path", "cache"):  # the file, wherever the run was started from
            out[key] = str(Path(out[key]).resolve()) if out[key] else out[key]
        return out

    def state_dict(self) -> dict:
        return {"resumed": self._resumed()}

    def load_state_dict(self, state: dict) -> None:
        """``fit --ckpt_path`` with other data settings than the saved run's says so, naming both
        values: the run goes on (a moved data file, a smaller batch on another machine can be meant),
        but it is not the saved run continued. ``validate`` may use any data."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != TrainerFn.FITTING:
            return
        saved, mine = state.get("resumed", {}), self._resumed()
        changed = [
            f"--data.{k} {mine[k]} (saved run: {saved[k]})"
            for k in mine
            if k in saved and saved[k] != mine[k]
        ]
        if changed:
            rank_zero_warn(
                f"--ckpt_path {trainer.ckpt_path} resumes a run trained with other data settings: "
                f"{', '.join(changed)}; the resumed run does not continue it exactly (other records, "
                "tokens or order; mid-epoch, its position is counted in batches of the new size)"
            )
