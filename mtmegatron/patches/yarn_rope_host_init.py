"""YaRN rotary embedding (DeepSeek-V3's MLA RoPE) built on the host on the CPU backend.

Target: megatron.core.models.common.embeddings.yarn_rotary_pos_embedding:YarnRotaryEmbedding.__init__
Reason: MLA builds ``YarnRotaryEmbedding`` without passing ``use_cpu_initialization``, so the constructor runs
``with torch.device(<current accelerator index>):``. On the CPU backend that is ``torch.device(0)``, an
accelerator index, which torch rejects ("Cannot access accelerator device when none is available") before
any call the bridge's device remapping can see (a context manager, not a tensor-creating call). The
replacement passes ``use_cpu_initialization=True``, which on this backend is the same memory.
Versions: megatron-core 0.16.x. Backends: cpu only.
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding:YarnRotaryEmbedding.__init__"


def apply():
    original = current(TARGET)

    def __init__(self, *args, **kwargs):
        kwargs["use_cpu_initialization"] = True
        original(self, *args, **kwargs)

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="yarn_rope_host_init",
    target=TARGET,
    reason="MLA's YarnRotaryEmbedding enters torch.device(<accelerator index>) unless built with "
    "use_cpu_initialization; on the cpu backend build it on the host",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
