"""The dead-letter record format keeps the original bytes exactly; CLI time words parse."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ingestion.dlq import MAX_DLQ_RAW_BYTES, DeadLetter, encode_reject, report
from ingestion.validate import Reason, Reject
from views.event import ts_millis

AT = datetime(2026, 11, 22, 12, 0, 0, 250000, tzinfo=UTC)


@pytest.mark.parametrize(
    "raw", [b'{"item": "caf\xc3\xa9"', b"caf\xe9 \xff\x00 binary", b"", b'a,b,"c\nd"\r\n'], ids=str
)
def test_dead_letters_round_trip_the_original_bytes(raw: bytes) -> None:
    reject = Reject(raw, Reason.NOT_UTF8, "invalid UTF-8", "logs/a.csv", 17, AT)
    value, headers, ts_ms = encode_reject(reject)
    obj = json.loads(value)
    assert obj["reason"] == "not_utf8" and obj["source"] == "logs/a.csv" and obj["line"] == 17
    assert obj["rejected_at"] == "2026-11-22T12:00:00.250Z"
    assert obj["raw_encoding"] == ("utf-8" if raw.decode("utf-8", "ignore").encode() == raw else "base64")
    assert dict(headers) == {"reason": b"not_utf8", "source": b"logs/a.csv"}
    assert ts_ms == ts_millis(AT)  # retention counts from the rejection, not the event time
    letter = DeadLetter.decode(value)
    assert (letter.raw, letter.reason, letter.line, letter.rejected_at, letter.truncated) == (
        raw,
        "not_utf8",
        17,
        AT,
        False,
    )


def test_huge_records_keep_their_start_and_say_how_big_they_were() -> None:
    raw = b"x" * (MAX_DLQ_RAW_BYTES + 10)
    letter = DeadLetter.decode(encode_reject(Reject(raw, Reason.OVERSIZE_RECORD, "big", "f", 1, AT, 5_000_000))[0])
    assert letter.truncated and letter.raw_size == 5_000_000 and letter.raw == raw[:MAX_DLQ_RAW_BYTES]


def test_foreign_values_are_not_dead_letters() -> None:
    for value in (b'{"v": 99}', b"[]", b"not json"):
        with pytest.raises(ValueError):
            DeadLetter.decode(value)


def test_report_counts_by_reason_and_keeps_samples() -> None:
    letters = [
        DeadLetter.decode(encode_reject(Reject(b"r%d" % i, reason, "d", f"s{i % 2}", i, AT))[0])
        for i, reason in enumerate([Reason.BAD_TIME] * 5 + [Reason.NON_FINITE] * 2)
    ]
    result = report(iter(letters), samples_per_reason=2)
    assert result.total == 7
    assert result.by_reason == {"bad_time": 5, "non_finite": 2}
    assert result.by_source == {"s0": 4, "s1": 3}
    assert [x.raw for x in result.samples["bad_time"]] == [b"r0", b"r1"]
