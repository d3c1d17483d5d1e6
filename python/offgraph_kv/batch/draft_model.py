"""A draft model for speculative decoding: :class:`DraftModel`.

A second model of the target's vocabulary drafts greedily on its own
:class:`~offgraph_kv.KvCellCache`: each speculating request has a draft sequence there holding
the request's tokens. Drafting ``k`` tokens feeds what the draft sequence lacks (the prompt at
first, then the tokens the last verification kept) and then ``k - 1`` single-token steps, every
speculating request in the same forwards. After verification the draft sequence is cut back to
what the target kept.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import _native as _okv
from .._errors import CacheError, InvalidArgumentError
from .model_step import model_step

__all__ = ["DraftModel", "open_draft"]


def open_draft(source: Any, threads: int | None = None) -> Any:
    """The draft model ``source`` names: a ``.gguf`` path is opened on the native engine."""
    if isinstance(source, (str, os.PathLike)):
        from ..gguf_model import GgufModel

        return GgufModel(source, threads=threads)
    return source


def _check_vocabulary(target: Any, draft: Any, dv: int, vocab_size: int) -> None:
    """Refuse a draft model whose token ids mean other text than the target's."""
    if dv != vocab_size:
        raise InvalidArgumentError(
            f"speculative: the draft model's vocabulary has {dv} tokens, the target's "
            f"{vocab_size}: a draft model must share the target's vocabulary"
        )
    ta, da = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if hasattr(ta, "token_bytes") and hasattr(da, "token_bytes"):
        for tok in range(0, vocab_size, max(1, vocab_size // 64)):
            if ta.token_bytes(tok) != da.token_bytes(tok):
                raise InvalidArgumentError(
                    f"speculative: token {tok} is {ta.token_bytes(tok)!r} for the target and "
                    f"{da.token_bytes(tok)!r} for the draft model: not the same vocabulary"
                )


class DraftModel:
    """Greedy drafts from a second model on its own cell cache (see the module)."""

    def __init__(
        self,
        model: Any,
        target: Any,
        vocab_size: int,
        n_cells: int,
        n_seq_max: int,
        max_step: int,
        kv_dtype: str | None = None,
    ):
        self.model = model
        self.step = model_step(model)
        _check_vocabulary(target, model, int(self.step.vocab_size), vocab_size)
        layers = self.step.layer_configs()
        kw: dict[str, Any] = {}
        if kv_dtype not in (None, "float32"):
            kw["dtype"] = kv_dtype
        cfg = _okv.CacheConfig(
            int(self.step.max_positions),
            len(layers),
            layers,
            initial_capacity=min(int(n_cells), 256),
            max_step=max_step,
            **kw,
        )
        self.kc = _okv.KvCellCache(cfg, n_cells, n_seq_max=n_seq_max)
        self.max_step = max_step
        self._seqs: dict[int, list[Any]] = {}  # rid -> [draft seq, tokens it holds]

    def draft(self, wants: list[tuple[Any, int]]) -> list[list[int]]:
        """Per ``(request, k)``: ``k`` greedy draft tokens (``[]`` for a request whose draft
        sequence does not fit the draft cache: it does not speculate this step)."""
        out: list[list[int]] = [[] for _ in wants]
        live: list[int] = []  # indices of wants being drafted
        feeds: list[list[int]] = []
        for i, (req, _) in enumerate(wants):
            self.verified(req)  # after a failed step it still holds the drafts of that step
            st = self._state(req)
            if st is None:
                continue
            live.append(i)
            feeds.append(req.tokens[st[1] :])
        # The first draft token: catch up on what each draft sequence lacks, in steps of at most
        # max_step tokens (a prompt's first catch-up may take several).
        try:
            firsts = self._catch_up([wants[i][0] for i in live], feeds)
        except CacheError:
            self._reset()
            return out
        for j, i in enumerate(live):
            out[i].append(firsts[j])
        # Then one token per step for every request that wants more.
        for _ in range(1, max((k for _, k in wants), default=0)):
            more = [i for i in live if len(out[i]) < wants[i][1]]
            if not more:
                break
            try:
                toks = self._forward([(wants[i][0], [out[i][-1]]) for i in more])
            except CacheError:
                self._reset()
                return [[] for _ in wants]
            for i, t in zip(more, toks, strict=True):
                out[i].append(t)
        return out

    def verified(self, req: Any) -> None:
        """Cut ``req``'s draft sequence back to the tokens the target kept."""
        st = self._seqs.get(req.rid)
        if st is None:
            return
        keep = len(req.tokens) - 1  # its last token is fed with the next draft
        if st[1] > keep:
            # What the draft sequence holds beyond the kept tokens: the draft's own tokens, only
            # the ones the target accepted agree.
            try:
                self.kc.seq_rm(st[0], keep)
                st[1] = keep
            except CacheError:
                self.release(req)

    def release(self, req: Any) -> None:
        st = self._seqs.pop(req.rid, None)
        if st is not None:
            self.kc.seq_free(st[0])

    def close(self) -> None:
        self._reset()

    # -- internals --------------------------------------------------------------------------------

    def _reset(self) -> None:
        for seq, _ in self._seqs.values():
            self.kc.seq_free(seq)
        self._seqs.clear()

    def _state(self, req: Any) -> list[Any] | None:
        st = self._seqs.get(req.rid)
        if st is None:
            try:
                st = self._seqs[req.rid] = [self.kc.seq_new(), 0]
            except CacheError:  # every draft sequence id taken
                return None
        return st

    def _catch_up(self, reqs: list[Any], feeds: list[list[int]]) -> list[int]:
        """Feed each request's missing tokens; the greedy token after each one's last."""
        firsts = [0] * len(reqs)
        at = [0] * len(reqs)
        while True:
            batch: list[tuple[Any, list[int]]] = []
            idx: list[int] = []
            room = self.max_step
            for j, feed in enumerate(feeds):
                n = min(len(feed) - at[j], room)
                if n <= 0:
                    continue
                batch.append((reqs[j], feed[at[j] : at[j] + n]))
                idx.append(j)
                room -= n
                if room == 0:
                    break
            if not batch:
                return firsts
            toks = self._forward(batch)
            for j, (_, part), t in zip(idx, batch, toks, strict=True):
                at[j] += len(part)
                firsts[j] = t

    def _forward(self, batch: list[tuple[Any, list[int]]]) -> list[int]:
        """One draft forward over each request's ``tokens`` (appended to its draft sequence);
        the argmax after each one's last token."""
        seq_ids: list[int] = []
        positions: list[int] = []
        tokens: list[int] = []
        rows: list[int] = []
        for req, toks in batch:
            st = self._seqs[req.rid]
            seq_ids += [st[0]] * len(toks)
            positions += range(st[1], st[1] + len(toks))
            tokens += toks
            rows.append(len(tokens) - 1)
        self.kc.begin_step(seq_ids, positions)
        try:
            logits = self.step.forward_cells(self.kc, tokens, positions, rows)
        except BaseException:
            self._reset()
            raise
        for req, toks in batch:
            self._seqs[req.rid][1] += len(toks)
        arr = logits.detach().float().cpu().numpy() if hasattr(logits, "detach") else logits
        return [int(t) for t in np.argmax(np.asarray(arr), axis=-1)]
