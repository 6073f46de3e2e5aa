"""Files a run or sweep writes are readable by the group and others, as the umask says."""

import os
import stat

import pytest

from rl_batch import artifacts


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_write_json_atomic_honours_the_umask(tmp_path, umask, mode):
    path = tmp_path / "summary.json"
    old = os.umask(umask)
    try:
        artifacts.write_json_atomic(str(path), {"status": "finished"})
        artifacts.write_json_atomic(str(path), {"status": "finished", "again": True})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert artifacts.read_json(str(path))["again"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary left
