"""One choice of a completion as it is produced: its text detokenized incrementally and cut at
a stop string, what may be streamed yet, and its tokens' logprobs matched to the text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._errors import InvalidArgumentError
from . import protocol as P
from .tools import ToolCallParser
from .worker import Job

__all__ = ["Choice", "token_text"]


@dataclass
class Choice:
    """One choice's text as it is produced: detokenized incrementally, cut at a stop string."""

    job: Job
    tok: Any
    stops: list[str]
    ids: list[int] = field(default_factory=list)
    text: str = ""  # the text so far, stop string excluded
    sent: int = 0  # characters of `text` already streamed
    reason: str | None = None  # set once the choice is over

    # Logprob entries of the tokens not reported yet, each with the end of its text in `text`
    # (a token's text runs from the previous one's end); `reported` is where the next starts.
    lps: list[tuple[int, Any]] = field(default_factory=list)
    reported: int = 0

    # With tools: the tool-call syntax's marker tokens (id -> text, kept in the text though
    # decoding drops special tokens), the parser of the text, and its events not sent yet.
    markers: dict[int, str] = field(default_factory=dict)
    parser: ToolCallParser | None = None
    events: list[tuple[Any, ...]] = field(default_factory=list)

    def add(self, token: int) -> None:
        self.ids.append(token)
        if self.tok is None:
            self.text = " ".join(str(t) for t in self.ids)  # a model without a tokenizer
            return
        self.text = self._decode()
        for s in self.stops:
            i = self.text.find(s)
            if i >= 0:
                self.text = self.text[:i]
                self.reason = "stop"

    def _decode(self) -> str:
        if not self.markers or not any(t in self.markers for t in self.ids):
            return self.tok.decode(self.ids)
        parts, run = [], []
        for t in self.ids:
            if t in self.markers:
                parts += [self.tok.decode(run), self.markers[t]]
                run = []
            else:
                run.append(t)
        return "".join([*parts, self.tok.decode(run)])

    def parse(self) -> None:
        """With tools: the text that is safe to send goes through the parser (all of it once
        the choice is over); a parser that takes no more calls ends the choice (``"stop"``)."""
        assert self.parser is not None
        self.events += self.parser.feed(self.pending())
        if self.parser.closed and self.reason is None:
            self.reason = "stop"
        if self.reason is not None and self.reason != "error":
            self.events += self.parser.finish()

    def finish_reason(self) -> str | None:
        """``"tool_calls"`` for a reply that ended on its own after calling tools."""
        if self.parser is not None and self.parser.calls and self.reason == "stop":
            return "tool_calls"
        return self.reason

    def tool_calls(self) -> list[dict[str, Any]]:
        """The calls as a whole reply's ``message.tool_calls``."""
        calls = self.parser.calls if self.parser is not None else []
        return [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]

    def add_logprob(self, entry: Any) -> None:
        """The logprob entry of the token :meth:`add` just took. A token's text is what it
        added to the choice's text, up to a partial character (the decoder's U+FFFD), which
        the token completing the character carries."""
        end = len(self.text.rstrip("\ufffd")) if self.reason is None else len(self.text)
        self.lps.append((max(end, self.lps[-1][0] if self.lps else self.reported), entry))
        if self.reason == "stop":  # tokens from the stop string on are not reported
            cut, kept, start = len(self.text), [], self.reported
            for end, e in self.lps:
                if start >= cut:
                    break
                kept.append((min(end, cut), e))
                start = end
            self.lps = kept

    def _ready(self, safe: int) -> int:
        """How many of the unreported tokens may be reported now: all once the choice is over;
        else those whose text ends by ``safe``, but not the ones ending where a partial
        character starts (if the generation ends there, the last of them carries the
        character's U+FFFD, as a whole answer has it)."""
        if self.reason is not None:
            return len(self.lps)
        hold = len(self.text.rstrip("\ufffd")) if self.text.endswith("\ufffd") else -1
        n = 0
        while n < len(self.lps) and self.lps[n][0] <= safe and self.lps[n][0] != hold:
            n += 1
        return n

    def take_logprobs(self) -> list[P.TokenLogprob] | None:
        """The logprobs of the tokens whose text has been sent (all once the choice is over),
        which are then reported; ``None`` when the job asked for none."""
        if self.job.logprobs is None:
            return None
        if self.reason is not None and self.lps:  # the text's tail (a partial char) is the last's
            self.lps[-1] = (len(self.text), self.lps[-1][1])
        out: list[P.TokenLogprob] = []
        for _ in range(self._ready(self.sent)):
            end, e = self.lps.pop(0)
            start, self.reported = self.reported, max(self.reported, end)
            text = self.text[start:end]
            top = [(text if t == e.token else token_text(self.tok, t), lp) for t, lp in e.top]
            out.append(P.TokenLogprob(text, start, e.logprob, top))
        return out

    def pending(self) -> str:
        """Text that is safe to send now: not a possible start of a stop string, not a partial
        UTF-8 character (the decoder's U+FFFD), unless the choice is over. With logprobs, text
        goes out whole tokens at a time, so a chunk's tokens are exactly the text it carries."""
        end = len(self.text)
        if self.reason is None:
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
            for s in self.stops:
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if self.text[end - k : end] == s[:k]:
                        end -= k
                        break
            if self.job.logprobs is not None:
                n = self._ready(end)
                end = max(self.sent, self.lps[n - 1][0] if n else self.reported)
        out = self.text[self.sent : end]
        self.sent = end
        return out


def token_text(tok: Any, token_id: int) -> str:
    """A token's text on its own, for the logprobs' top alternatives (the tokenizer face's: a
    GGUF token's bytes, an incomplete character as U+FFFD); its id without a tokenizer, and
    nothing for an id past the tokenizer's vocabulary (a model's padded rows). A chosen
    token's text is what it added to the choice's text."""
    if tok is None:
        return str(token_id)
    try:
        if callable(getattr(tok, "token_text", None)):  # the serve tokenizer faces
            return tok.token_text(token_id)
        if callable(getattr(tok, "token_bytes", None)):
            return bytes(tok.token_bytes(token_id)).decode("utf-8", errors="replace")
        return tok.decode([token_id])
    except InvalidArgumentError:
        return ""
