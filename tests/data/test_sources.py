"""``memrl data fetch`` and how configs find dataset files: a local HTTP server with Range support stands in
for the publishers (no network); the pinned checksums are checked against the real files where present."""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest

from memrl.adapters import LOCOMO_FIXTURE
from memrl.cli.main import main
from memrl.data.adapters import AdapterError, load_dataset, run_adapter
from memrl.data.config import DataConfig
from memrl.data.sources import (
    SOURCES,
    ChecksumError,
    DatasetNotFound,
    DatasetSource,
    FetchError,
    OfficialFile,
    fetch,
    fetch_file,
    resolve_path,
    search_path,
    sha256_of,
)

REAL = {
    "locomo10.json": Path("/work/shared/data/locomo/locomo10.json"),
    "longmemeval_oracle.json": Path("/work/shared/data/longmemeval/longmemeval_oracle.json"),
}
BODY = bytes(range(256)) * 4096  # 1 MiB: several read chunks


@pytest.fixture(autouse=True)
def _dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MEMRL_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)


class _Server:
    """Serves ``files`` over HTTP; honours ``Range: bytes=N-`` unless ``ranges`` is off; ``cut`` bytes = the
    connection drops after that many body bytes (once). Records each request's Range header."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.ranges, self.cut, self.seen = files, True, None, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                body = server.files.get(self.path.lstrip("/"))
                if body is None:
                    self.send_error(404)
                    return
                rng = self.headers.get("Range")
                server.seen.append(rng)
                start = int(rng.split("=")[1].rstrip("-")) if rng and server.ranges else 0
                if start >= len(body) and rng:
                    self.send_error(416)
                    return
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                payload = body[start:]
                if server.cut is not None:
                    payload, server.cut = payload[: server.cut], None
                    self.wfile.write(payload)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(payload)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    srv = _Server({"data.json": BODY})
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def _spec(server, sha256=hashlib.sha256(BODY).hexdigest()) -> OfficialFile:
    return OfficialFile("data.json", f"{server.url}/data.json", sha256)


def test_download_checks_the_pinned_checksum_then_keeps_a_present_file(server, tmp_path):
    got = fetch_file(_spec(server), tmp_path / "d")
    assert (tmp_path / "d" / "data.json").read_bytes() == BODY
    assert (got.status, got.checksum, got.bytes) == ("downloaded", "pinned", len(BODY))
    assert not (tmp_path / "d" / "data.json.part").exists()
    again = fetch_file(_spec(server), tmp_path / "d")
    assert again.status == "present" and server.seen == [None]  # no second request


def test_partial_file_resumes_with_a_range_request(server, tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "data.json.part").write_bytes(BODY[:300_000])
    fetch_file(_spec(server), folder)
    assert server.seen == ["bytes=300000-"]
    assert (folder / "data.json").read_bytes() == BODY


def test_interrupted_download_keeps_its_part_and_the_next_run_finishes_it(server, tmp_path):
    server.cut = 200_000
    with pytest.raises(FetchError, match="interrupted after 200000 bytes.*run the command again"):
        fetch_file(_spec(server), tmp_path)
    assert (tmp_path / "data.json.part").stat().st_size == 200_000
    fetch_file(_spec(server), tmp_path)
    assert server.seen == [None, "bytes=200000-"]
    assert (tmp_path / "data.json").read_bytes() == BODY


def test_server_without_range_support_restarts_the_file(server, tmp_path):
    server.ranges = False
    (tmp_path / "data.json.part").write_bytes(b"stale bytes from another version")
    fetch_file(_spec(server), tmp_path)
    assert (tmp_path / "data.json").read_bytes() == BODY


def test_complete_part_file_is_accepted_on_416(server, tmp_path):
    (tmp_path / "data.json.part").write_bytes(BODY)
    assert fetch_file(_spec(server), tmp_path).status == "downloaded"
    assert (tmp_path / "data.json").read_bytes() == BODY


def test_checksum_mismatch_removes_the_download(server, tmp_path):
    with pytest.raises(ChecksumError, match="expected 0000"):
        fetch_file(_spec(server, sha256="0" * 64), tmp_path)
    assert not (tmp_path / "data.json").exists() and not (tmp_path / "data.json.part").exists()


def test_unpinned_file_records_its_checksum_on_first_download_and_is_held_to_it(server, tmp_path):
    got = fetch_file(_spec(server, sha256=None), tmp_path)
    assert got.checksum == "recorded"
    assert json.loads((tmp_path / "checksums.json").read_text()) == {"data.json": got.sha256}
    (tmp_path / "data.json").write_bytes(BODY[:-1] + b"x")  # corrupted later
    with pytest.raises(ChecksumError, match="recorded"):
        fetch_file(_spec(server, sha256=None), tmp_path)
    server.files["data.json"] = b"a different file"
    with pytest.raises(ChecksumError):
        fetch_file(_spec(server, sha256=None), tmp_path, force=True)


def test_unreachable_host_says_offline_and_where_to_put_a_copy(tmp_path):
    spec = OfficialFile(
        "data.json", "http://127.0.0.1:9/data.json", None
    )  # port 9 (discard): nothing listens
    with pytest.raises(
        FetchError, match=r"cannot reach http://127.0.0.1:9/data.json .*offline.*MEMRL_DATA_DIR"
    ):
        fetch_file(spec, tmp_path)
    missing = OfficialFile("x.json", (tmp_path / "nowhere.json").as_uri(), None)
    with pytest.raises(FetchError, match="cannot reach"):
        fetch_file(missing, tmp_path)


def test_cli_fetch_offline_exits_1_with_the_reason(monkeypatch, capsys):
    offline = OfficialFile(
        "locomo10.json", "http://127.0.0.1:9/locomo10.json", SOURCES["locomo"].files[0].sha256
    )
    monkeypatch.setitem(SOURCES, "locomo", DatasetSource("locomo", "", "", (offline,)))
    assert main(["data", "fetch", "locomo"]) == 1
    assert "cannot reach http://127.0.0.1:9/locomo10.json" in capsys.readouterr().err


def test_cli_fetch_from_a_mirror_then_configs_find_the_file(monkeypatch, capsys, tmp_path):
    mirror = OfficialFile(
        "locomo10.json", LOCOMO_FIXTURE.as_uri(), sha256_of(LOCOMO_FIXTURE)
    )  # file:// URL: the fixture plays the official file
    monkeypatch.setitem(SOURCES, "locomo", DatasetSource("locomo", "", "", (mirror,)))
    assert main(["data", "fetch", "locomo"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["path"] == str(tmp_path / "cache" / "datasets" / "locomo" / "locomo10.json")
    assert row["status"] == "downloaded"
    episodes, _ = load_dataset(DataConfig(adapter="locomo", path="locomo10.json", split="all"))
    assert len(episodes) == 8
    unset, _ = load_dataset(DataConfig(adapter="locomo", path=None, split="all"))  # the default file
    assert [e.episode_id for e in unset] == [e.episode_id for e in episodes]
    assert main(["data", "check", "locomo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 8


def test_unknown_file_or_dataset_is_a_usage_error(capsys):
    assert main(["data", "fetch", "longmemeval", "--file", "nope.json"]) == 2
    assert "longmemeval_s.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["data", "fetch", "squad"])
    with pytest.raises(ValueError, match="valid choices: locomo, longmemeval"):
        fetch("squad")


def test_lookup_order_path_then_data_dir_then_fetch_cache(monkeypatch, tmp_path):
    cached = tmp_path / "cache" / "datasets" / "locomo" / "locomo10.json"
    cached.parent.mkdir(parents=True)
    shutil.copy(LOCOMO_FIXTURE, cached)
    assert resolve_path("locomo", "locomo10.json") == str(cached)
    data = tmp_path / "data"
    (data / "locomo").mkdir(parents=True)
    shutil.copy(LOCOMO_FIXTURE, data / "locomo" / "locomo10.json")
    monkeypatch.setenv("MEMRL_DATA_DIR", str(data))
    assert resolve_path("locomo", None) == str(data / "locomo" / "locomo10.json")
    shutil.copy(LOCOMO_FIXTURE, data / "locomo10.json")
    assert resolve_path("locomo", "locomo10.json") == str(data / "locomo10.json")
    shutil.copy(LOCOMO_FIXTURE, tmp_path / "locomo10.json")
    assert resolve_path("locomo", "locomo10.json") == "locomo10.json"
    assert resolve_path("synthetic", None) is None and search_path("synthetic", "-") == []
    # a file of a known dataset read through a user adapter is still found in the cache
    assert search_path("my.mod:fn", "locomo10.json")[-1] == cached


def test_missing_file_names_the_fetch_command_and_every_place_searched(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMRL_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(DatasetNotFound) as exc:
        resolve_path("longmemeval", "longmemeval_s.json")
    msg = str(exc.value)
    assert "`memrl data fetch longmemeval --file longmemeval_s.json`" in msg
    for place in exc.value.searched:
        assert str(place) in msg
    assert len(exc.value.searched) == 4
    with pytest.raises(AdapterError, match="no such file.*memrl data fetch locomo"):
        run_adapter("locomo", None, split="all")
    with pytest.raises(AdapterError, match="no such file.*`memrl data fetch locomo`"):
        run_adapter("locomo", str(tmp_path / "renamed.json"), split="all")
    # a file memrl does not know is left to its adapter (which names the missing file itself)
    assert resolve_path("my.mod:fn", "mine.json") == "mine.json"


def test_cli_check_without_the_file_points_at_fetch(capsys):
    assert main(["data", "check", "locomo", "--json"]) == 1
    assert "memrl data fetch locomo" in capsys.readouterr().out


@pytest.mark.parametrize(
    "dataset,name", [("locomo", "locomo10.json"), ("longmemeval", "longmemeval_oracle.json")]
)
def test_pinned_checksums_match_the_official_files(dataset, name, tmp_path, monkeypatch):
    real = REAL[name]
    if not real.is_file():
        pytest.skip(f"{real} not on this machine")
    official = SOURCES[dataset].file(name)
    assert sha256_of(real) == official.sha256
    local = OfficialFile(name, real.as_uri(), official.sha256)
    monkeypatch.setitem(SOURCES, dataset, DatasetSource(dataset, "", "", (local,)))
    (got,) = fetch(dataset)
    assert got.sha256 == official.sha256 and got.checksum == "pinned"
