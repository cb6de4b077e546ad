"""Reading HF safetensors checkpoints: one file or shards with ``model.safetensors.index.json``;
DeepSeek FP8 weights (float8 with a ``<name>_scale_inv`` per 128x128 block) are dequantized on read.

May assume: the ``safetensors`` package (a dependency of transformers).
"""

from __future__ import annotations

import glob
import json
import os

import torch
from safetensors import SafetensorError, safe_open

from mtmegatron.models.families import ConversionError

INDEX = "model.safetensors.index.json"
FP8_BLOCK = 128


def dequantize_fp8_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """fp32 weight from an FP8 weight and its per-block inverse scales (blocks at the edge may be partial)."""
    rows, cols = weight.shape
    scale = scale_inv.float().repeat_interleave(block, dim=0)[:rows].repeat_interleave(block, dim=1)[:, :cols]
    return weight.float() * scale


class HFCheckpoint:
    """Lazy name -> tensor access over a checkpoint directory (``hf[name]``; ``names`` lists the logical
    weights, scale tensors folded into the weights they scale). ``dtype`` None keeps each tensor's stored dtype
    (FP8 weights: bfloat16 after dequantization). ``keep_open`` False maps a file only while reading a tensor
    (a streaming reader's RSS then holds no file pages it read earlier)."""

    def __init__(self, directory: str, dtype: torch.dtype | None = torch.float32, keep_open: bool = True):
        self.directory, self.dtype, self.keep_open = directory, dtype, keep_open
        if not os.path.isdir(directory):
            raise ConversionError(f"--hf-dir {directory}: no such directory")
        index = os.path.join(directory, INDEX)
        if os.path.isfile(index):
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ConversionError(f"{index}: no \"weight_map\" object (tensor name -> shard file)")
            self._file_of = {name: os.path.join(directory, file) for name, file in weight_map.items()}
            absent = sorted({f for f in self._file_of.values() if not os.path.isfile(f)})
            if absent:
                raise ConversionError(f"{index} lists {os.path.basename(absent[0])}, which is not in {directory}"
                                      + (f" ({len(absent)} listed shards missing)" if len(absent) > 1 else ""))
        else:
            files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
            if not files:
                raise ConversionError(f"--hf-dir {directory}: no *.safetensors files and no {INDEX}")
            self._file_of = {}
            for path in files:
                self._file_of.update({name: path for name in _header(path)})
        self._open, self._headers = {}, {}
        self.names = sorted(n for n in self._file_of if not n.endswith("_scale_inv"))
        self.used: set[str] = set()

    def _raw(self, name: str) -> torch.Tensor:
        path = self._file_of[name]
        self.stored(name)  # the header names it with the size its file has, or one line says why not
        try:
            if not self.keep_open:  # unmapped after each read: the file's pages do not stay in this process's RSS
                with safe_open(path, "pt") as f:
                    return f.get_tensor(name)
            if path not in self._open:
                self._open[path] = safe_open(path, "pt")
            return self._open[path].get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise ConversionError(f"{path}: cannot read {name} ({e})") from None

    def stored(self, name: str) -> tuple[list[int], str]:
        """(shape, safetensors dtype string such as "BF16") of ``name`` as stored, from its file's header (read
        once per file, without mapping any tensor)."""
        path = self._file_of[name]
        if path not in self._headers:
            self._headers[path] = _header(path)
        if name not in self._headers[path]:
            raise ConversionError(f"{os.path.join(self.directory, INDEX)} places {name} in "
                                  f"{os.path.basename(path)}, which has no such tensor")
        return self._headers[path][name]

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._file_of:
            raise KeyError(f"{name} is not in the checkpoint at {self.directory}")
        self.used.add(name)
        tensor = self._raw(name)
        scale_name = name + "_scale_inv"
        if tensor.element_size() == 1 and tensor.is_floating_point() and scale_name in self._file_of:
            tensor = dequantize_fp8_blocks(tensor, self._raw(scale_name))
            if self.dtype is None:  # the dtype DeepSeek trains and releases its dequantized weights in
                return tensor.to(torch.bfloat16)
        return tensor if self.dtype is None else tensor.to(self.dtype)

    def config(self) -> dict:
        path = os.path.join(self.directory, "config.json")
        if not os.path.isfile(path):
            raise ConversionError(f"--hf-dir {self.directory}: no config.json")
        return read_json(path)


def read_json(path: str) -> dict:
    """A JSON object from ``path``, or a ConversionError naming the file and what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        raise ConversionError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except UnicodeDecodeError:
        raise ConversionError(f"{path}: not UTF-8 text") from None
    if not isinstance(value, dict):
        raise ConversionError(f"{path}: a JSON object is expected, not {type(value).__name__}")
    return value


def _header(path: str) -> dict:
    """{name: (shape, safetensors dtype string)} of one file, from its header alone; a file that is not a whole
    safetensors file (truncated, a broken header) is a ConversionError naming it."""
    try:
        with safe_open(path, "pt") as f:
            return {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise ConversionError(f"{path}: not a readable safetensors file ({e})") from None
