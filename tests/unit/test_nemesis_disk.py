"""The nemesis's full disk: a tmpfs of the bench's own, filled to the last byte with a ballast, held
full while space is freed under it, then freed; unmounted on the way out even when the run fails.
Root only (mounting): elsewhere it skips loudly, and fails under CI."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path

import pytest

from oste.bench import faults
from oste.bench.nemesis import TOP_UP_EVERY, Nemesis, _volume
from tests.faults import unsupported


def mounted(where: Path) -> bool:
    return any(line.split()[1] == str(where) for line in Path("/proc/mounts").read_text().splitlines())


def volume_at(where: Path) -> faults.Tmpfs:
    try:
        return faults.Tmpfs(where, "1m").__enter__()
    except faults.FaultUnsupported as exc:
        unsupported(str(exc))


def test_fill_leaves_not_a_byte_and_free_gives_it_back(tmp_path: Path) -> None:
    volume = volume_at(tmp_path / "v")
    try:
        assert volume.fill() > 0
        assert volume.available() == 0
        with pytest.raises(OSError) as refused, (volume.where / "more").open("wb", buffering=0) as out:
            out.write(b"x")
        assert refused.value.errno == errno.ENOSPC
        volume.free()
        assert volume.available() > 512 * 1024
    finally:
        volume.__exit__(None, None, None)
    assert not mounted(tmp_path / "v")


def test_the_volume_is_unmounted_when_the_run_fails(tmp_path: Path) -> None:
    notes: list[str] = []
    with pytest.raises(RuntimeError), _volume(False, tmp_path, notes) as volume:
        if volume is None:
            unsupported(notes[0])
        (volume.where / "held").open("wb")  # a file still open: the unmount must not fail on it
        assert mounted(volume.where)
        raise RuntimeError("the run failed")
    assert not mounted(tmp_path / "volume")


async def test_a_disk_full_fault_holds_the_volume_full_then_frees_it(tmp_path: Path) -> None:
    volume = volume_at(tmp_path / "v")
    try:
        nemesis = Nemesis(None, None, None, None, volume)  # type: ignore[arg-type]
        began = time.monotonic()
        fault = asyncio.create_task(nemesis._disk_full(1.5))
        while not volume.ballast.exists() or volume.available():
            assert time.monotonic() - began < 5, "the volume never filled"
            await asyncio.sleep(0.01)
        os.truncate(volume.ballast, volume.ballast.stat().st_size - 65536)  # space comes free meanwhile
        await asyncio.sleep(TOP_UP_EVERY + 0.2)
        assert volume.available() == 0, "space freed during the fault was not taken back"
        await fault
        assert time.monotonic() - began >= 1.5
        assert not volume.ballast.exists() and volume.available() > 512 * 1024
    finally:
        volume.__exit__(None, None, None)


def test_where_it_cannot_mount_the_run_says_so_loudly_and_goes_on_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    notes: list[str] = []
    with _volume(False, tmp_path, notes) as volume:
        assert volume is None
    assert "NO FULL DISK" in notes[0] and "root" in notes[0], notes
    assert "WARNING: NO FULL DISK" in capsys.readouterr().err
