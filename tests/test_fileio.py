"""Atomic writes (avsr.fileio) and the one definition of the modality names (avsr.modalities)."""

import pytest

from avsr.fileio import atomic_path, tmp_path_for, write_text_atomic
from avsr.modalities import MODALITIES, MODALITY_INPUTS, STREAMS, check_modality


def test_atomic_path_replaces_the_target_only_when_the_block_succeeds(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with atomic_path(target) as tmp:
        assert tmp == tmp_path_for(target) and tmp.parent == target.parent
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # nothing visible before the block ends
    assert target.read_bytes() == b"new" and not tmp.exists()
    with pytest.raises(RuntimeError, match="interrupted"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"new" and list(tmp_path.iterdir()) == [target]  # old kept, no temp left
    write_text_atomic(target, "text ü\n")
    assert target.read_text(encoding="utf-8") == "text ü\n"
    with pytest.raises(OSError):
        write_text_atomic(tmp_path / "missing" / "x.txt", "x")


def test_modality_names_are_defined_once():
    assert MODALITIES == ("audio", "video", "audiovisual") and STREAMS == ("audio", "video")
    assert set(MODALITY_INPUTS) == set(MODALITIES)
    assert all(set(streams) <= set(STREAMS) for streams in MODALITY_INPUTS.values())
    assert MODALITY_INPUTS["audiovisual"] == STREAMS
    assert check_modality("video") == "video"
    names = r"\['audio', 'video', 'audiovisual'\]"
    with pytest.raises(ValueError, match=rf"--modality must be one of {names}, got 'av'"):
        check_modality("av", "--modality")
