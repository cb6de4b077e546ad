"""convert/synthetic.py's DeepSeek-V3-shaped checkpoint (what ``benchmarks/convert.py --families deepseek-v3``
converts): the names are the released per-expert layout the converter reads (transformers >= 5 stacks experts in
memory; the generator splits them back), and it converts HF -> mcore -> HF bit-exactly (bf16, 2 workers). On the
way: hf-to-mcore's workers write items without a CRC-32 (half their time) and the export still memory-maps them."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.cli_subprocess import run_cli


def test_deepseek_shaped_synthetic_checkpoint_round_trips(tmp_path):
    from mtmegatron.convert.hf_io import HFCheckpoint
    from mtmegatron.convert.synthetic import deepseek_shape_for, write_from_config

    config = deepseek_shape_for(12 * 10**6, hidden=256, experts=8)
    written = write_from_config(str(tmp_path / "hf"), config)
    assert config["num_hidden_layers"] >= 2 and 6 * 10**6 < written < 24 * 10**6, (config, written)
    hf = HFCheckpoint(str(tmp_path / "hf"), dtype=None)
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in hf.names
    assert not any(n.endswith("gate_up_proj") for n in hf.names)
    assert hf["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    run_cli("convert", "hf-to-mcore", "--model", "deepseek-v3", "--hf-dir", str(tmp_path / "hf"),
            "--out", str(tmp_path / "mcore"), "--workers", "2")
    _items_are_written_without_crc_and_still_map(tmp_path / "mcore" / "iter_0000000")
    run_cli("convert", "mcore-to-hf", "--load", str(tmp_path / "mcore"), "--out", str(tmp_path / "back"),
            "--workers", "2")
    back = HFCheckpoint(str(tmp_path / "back"), dtype=None)
    assert back.names == hf.names
    for name in hf.names:
        assert back[name].dtype == hf[name].dtype and torch.equal(back[name], hf[name]), name


def _items_are_written_without_crc_and_still_map(directory: Path) -> None:
    import io
    import zipfile

    from torch.distributed.checkpoint import FileSystemReader

    from mtmegatron.convert.stored_tensor import _Slice, map_saved_tensor

    reader = FileSystemReader(str(directory))
    reader.set_up_storage_reader(reader.read_metadata(), is_coordinator=True)
    infos = [i for i in reader.storage_data.values() if i.relative_path.startswith("__conv")]
    assert infos, "no worker-written items"
    for info in infos[:5]:
        path = str(directory / info.relative_path)
        with open(path, "rb") as f:
            members = zipfile.ZipFile(_Slice(f, info.offset, info.length)).infolist()
            crcs = {z.filename.rsplit("/", 1)[-1]: z.CRC for z in members}
            f.seek(info.offset)
            loaded = torch.load(io.BytesIO(f.read(info.length)))
        assert crcs["data.pkl"] == 0, crcs
        got = map_saved_tensor(path, info.offset, info.length)
        assert got is not None and torch.equal(got, loaded)
