"""The weight store: sha256 checks, pre-serialised tensors, bytes-bounded LRU, coalesced loads."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from trtfleet_router.errors import WeightsUnavailable
from trtfleet_router.weights import ArtifactRef, FileReader, SchemeReader, WeightStore

from tests.unit.router.harness import write_artifact


class CountingReader:
    """A real file reader that counts reads and can hold them until released."""

    def __init__(self) -> None:
        self.inner = FileReader()
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def read(self, uri: str, name: str) -> bytes:
        self.reads += 1
        await self.gate.wait()
        return await self.inner.read(uri, name)


def test_load_verifies_and_serialises(tmp_path: Path) -> None:
    sha = write_artifact(tmp_path / "a", rows=3, width=8)
    weights = asyncio.run(WeightStore(reader=FileReader()).get(ArtifactRef(str(tmp_path / "a"), sha)))
    array = np.load(tmp_path / "a" / "model.lora_weights.npy")
    assert weights.weights_raw == array.tobytes() and weights.weights_shape == (1, 3, 8)
    assert weights.weights_datatype == "FP16" and weights.config_shape == (1, 3, 3)
    assert weights.config_raw == np.load(tmp_path / "a" / "model.lora_config.npy").astype("<i4").tobytes()
    assert weights.weights_sha256 == sha


def test_file_uri_and_bf16(tmp_path: Path) -> None:
    write_artifact(tmp_path / "b", dtype="bfloat16")
    weights = asyncio.run(WeightStore(reader=FileReader()).get(ArtifactRef(f"file://{tmp_path / 'b'}")))
    assert weights.weights_datatype == "BF16"


def test_expected_sha256_mismatch(tmp_path: Path) -> None:
    write_artifact(tmp_path / "a")
    with pytest.raises(WeightsUnavailable, match="was expected"):
        asyncio.run(WeightStore(reader=FileReader()).get(ArtifactRef(str(tmp_path / "a"), "0" * 64)))


def test_tampered_file_rejected(tmp_path: Path) -> None:
    sha = write_artifact(tmp_path / "a")
    np.save(tmp_path / "a" / "model.lora_config.npy", np.zeros((1, 4, 3), np.int32))
    with pytest.raises(WeightsUnavailable, match="manifest says"):
        asyncio.run(WeightStore(reader=FileReader()).get(ArtifactRef(str(tmp_path / "a"), sha)))


def test_manifest_sha256_accepted_as_identity(tmp_path: Path) -> None:
    write_artifact(tmp_path / "a")
    manifest_sha = hashlib.sha256((tmp_path / "a" / "manifest.json").read_bytes()).hexdigest()
    weights = asyncio.run(WeightStore(reader=FileReader()).get(ArtifactRef(str(tmp_path / "a"), manifest_sha)))
    assert weights.weights_raw == np.load(tmp_path / "a" / "model.lora_weights.npy").tobytes()
    assert weights.config_raw == np.load(tmp_path / "a" / "model.lora_config.npy").astype("<i4").tobytes()


def test_missing_artifact_and_bad_manifest(tmp_path: Path) -> None:
    with pytest.raises(WeightsUnavailable, match="cannot read"):
        asyncio.run(WeightStore(reader=FileReader()).get(ArtifactRef(str(tmp_path / "missing"))))
    write_artifact(tmp_path / "a")
    (tmp_path / "a" / "manifest.json").write_text(json.dumps({"outputs": {}}))
    with pytest.raises(WeightsUnavailable, match="no sha256"):
        asyncio.run(WeightStore(reader=FileReader()).get(ArtifactRef(str(tmp_path / "a"))))


def test_concurrent_loads_coalesce(tmp_path: Path) -> None:
    write_artifact(tmp_path / "a")

    async def scenario() -> None:
        reader = CountingReader()
        reader.gate.clear()
        store = WeightStore(reader=reader)
        ref = ArtifactRef(str(tmp_path / "a"))
        waiters = [asyncio.create_task(store.get(ref)) for _ in range(20)]
        await asyncio.sleep(0.01)
        waiters[0].cancel()  # a client that went away does not cancel the shared load
        reader.gate.set()
        results = await asyncio.gather(*waiters[1:])
        assert all(r is results[0] for r in results)
        assert reader.reads == 3 and store.loads == 1  # three files, one load
        assert await store.get(ref) is results[0] and reader.reads == 3

    asyncio.run(scenario())


def test_failed_load_reaches_every_waiter_and_is_retried(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = WeightStore(reader=FileReader())
        ref = ArtifactRef(str(tmp_path / "late"))
        results = await asyncio.gather(*(store.get(ref) for _ in range(5)), return_exceptions=True)
        assert all(isinstance(r, WeightsUnavailable) for r in results) and store.loads == 1
        write_artifact(tmp_path / "late")
        await store.get(ref)
        assert store.loads == 2

    asyncio.run(scenario())


def test_lru_is_bounded_in_bytes(tmp_path: Path) -> None:
    refs = []
    for i in range(4):
        write_artifact(tmp_path / f"a{i}", rows=4, width=64, seed=i)
        refs.append(ArtifactRef(str(tmp_path / f"a{i}")))

    async def scenario() -> None:
        one = (await WeightStore(reader=FileReader()).get(refs[0])).nbytes
        store = WeightStore(capacity_bytes=2 * one, reader=FileReader())
        for ref in refs[:3]:
            await store.get(ref)
        assert refs[0] not in store and refs[1] in store and refs[2] in store
        assert store.held_bytes == 2 * one
        await store.get(refs[1])  # refresh: a1 is now the most recent
        await store.get(refs[3])
        assert refs[1] in store and refs[2] not in store
        tiny = WeightStore(capacity_bytes=one // 2, reader=FileReader())
        await tiny.get(refs[0])
        assert refs[0] not in tiny and tiny.held_bytes == 0  # too large to cache, still served

    asyncio.run(scenario())


def test_http_artifacts(tmp_path: Path) -> None:
    from aiohttp import web

    sha = write_artifact(tmp_path / "served" / "a")

    async def scenario() -> None:
        app = web.Application()
        app.router.add_static("/artifacts", tmp_path / "served")
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        reader = SchemeReader()
        try:
            store = WeightStore(reader=reader)
            weights = await store.get(ArtifactRef(f"http://127.0.0.1:{port}/artifacts/a", sha))
            assert weights.weights_sha256 == sha
            with pytest.raises(WeightsUnavailable, match="cannot fetch"):
                await store.get(ArtifactRef(f"http://127.0.0.1:{port}/artifacts/missing"))
            with pytest.raises(WeightsUnavailable, match="unsupported artifact uri scheme"):
                await store.get(ArtifactRef("ftp://host/a"))
        finally:
            await reader.close()
            await runner.cleanup()

    asyncio.run(scenario())


def test_pvc_uris_read_from_the_mounted_claim(tmp_path: Path) -> None:
    from trtfleet_router.weights import SchemeReader, pvc_path

    assert pvc_path("pvc://trtfleet-adapters/abc-float16", "/mnt/x") == "/mnt/x/trtfleet-adapters/abc-float16"
    (tmp_path / "claim" / "dir").mkdir(parents=True)
    (tmp_path / "claim" / "dir" / "manifest.json").write_bytes(b"{}")
    data = asyncio.run(SchemeReader(pvc_root=str(tmp_path)).read("pvc://claim/dir", "manifest.json"))
    assert data == b"{}"


def test_s3_without_boto3_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if the s3 extra were not installed
    with pytest.raises(WeightsUnavailable, match="'s3' extra"):
        asyncio.run(WeightStore(reader=SchemeReader()).get(ArtifactRef("s3://bucket/adapters/a")))
