"""Typed configuration sections (utils/section.py): every ``Section`` under mtmegatron/ names only dests the
pretrain parser defines and has no defaults; ``Resilience.of`` holds the values the flags gave, unchanged;
``RunConfig.of`` builds the same section; a missing value is one error naming the section and the field; equal
sections are equal and hashable (the rerun machine is kept for an equal one). The checkpoint and observability
sections hold their flags' values, drive the non-persistent checkpoints, cover every value Megatron-LM's FLOP
formula reads, and their packages read no ``args.<name>`` (but the two modules whose subject is the Namespace)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import itertools
from pathlib import Path

import pytest

from mtmegatron import config
from mtmegatron.config import arguments
from mtmegatron.training.checkpoint import non_persistent
from mtmegatron.training.checkpoint.section import Checkpoint
from mtmegatron.training.observability import throughput
from mtmegatron.training.observability.section import Observability, Shape
from mtmegatron.training.resilience import rerun
from mtmegatron.training.resilience.section import Resilience
from mtmegatron.utils.section import Section

PACKAGE = Path(arguments.__file__).resolve().parents[1]
FLAGS = ["--rerun-mode", "disabled", "--check-for-spiky-loss", "--no-check-for-nan-in-loss-and-grad",
         "--exit-signal-handler", "--exit-signal", "SIGUSR1", "--exit-duration-in-mins", "7",
         "--check-weight-hash-across-dp-replicas-interval", "3", "--distributed-timeout-seconds-after-init", "90",
         "--error-injection-rate", "5", "--error-injection-type", "correct_result"]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sections")  # the rerun machine creates its tracker file
    return config.parse(["--log-dir", str(tmp), "--result-rejected-tracker-filename", str(tmp / "rejected.txt")]
                        + FLAGS)


def test_every_section_names_only_parser_dests_and_has_no_defaults():
    for path in PACKAGE.rglob("section.py"):
        module = ".".join(("mtmegatron",) + path.relative_to(PACKAGE).with_suffix("").parts)
        importlib.import_module(module)
    sections = list(_subclasses(Section))
    assert {Resilience, Checkpoint, Observability, Shape} <= set(sections)
    dests = {action.dest for action in arguments.build_parser()._actions}
    for section in sections:
        fields = dataclasses.fields(section)
        assert fields, section
        assert section.__dataclass_params__.frozen, section
        unknown = [f.name for f in fields if f.name not in dests]
        assert not unknown, f"{section.__qualname__}: not flag dests: {unknown}"
        defaulted = [f.name for f in fields if f.default is not dataclasses.MISSING
                     or f.default_factory is not dataclasses.MISSING]
        assert not defaulted, f"{section.__qualname__}: fields with defaults: {defaulted}"


def test_resilience_holds_the_flag_values(cfg):
    section = cfg.of(Resilience)
    assert section == Resilience(
        rerun_mode="disabled", error_injection_rate=5, error_injection_type="correct_result",
        result_rejected_tracker_filename=cfg.args.result_rejected_tracker_filename, check_for_nan_in_loss_and_grad=False,
        check_for_spiky_loss=True, exit_signal_handler=True, exit_signal="SIGUSR1", exit_duration_in_mins=7,
        check_weight_hash_across_dp_replicas_interval=3, distributed_timeout_seconds_after_init=90)
    assert section.result_rejected_tracker_filename.endswith("rejected.txt")
    assert all(getattr(section, f.name) is getattr(cfg.args, f.name) for f in dataclasses.fields(Resilience))
    with pytest.raises(dataclasses.FrozenInstanceError):
        section.rerun_mode = "validate_results"


def test_a_missing_value_is_one_error_naming_the_section_and_field(cfg):
    values = argparse.Namespace(**{f.name: getattr(cfg.args, f.name) for f in dataclasses.fields(Resilience)})
    del values.exit_signal
    with pytest.raises(AttributeError, match=r"Resilience\.of: the values have no 'exit_signal'"):
        Resilience.of(values)


def test_equal_sections_are_equal_hashable_and_keep_the_rerun_machine(cfg):
    one = Resilience.of(cfg.args)
    copied = argparse.Namespace(**vars(cfg.args))
    other = Resilience.of(copied)  # another object with the same values
    assert one == other and one is not other and hash(one) == hash(other) and len({one, other}) == 1
    copied.exit_duration_in_mins = 8
    assert Resilience.of(copied) != one
    first = rerun.machine(one)
    try:
        assert rerun.machine(other) is first  # an equal section never rebuilds the machine
        assert rerun.machine(Resilience.of(copied)) is not first
    finally:
        rerun.destroy_rerun_state_machine()
        rerun._section = None


def test_the_task_step_says_whether_its_loss_is_validated(cfg):
    """The start-up line takes it from the run's Step (the loop never asks the family): LLaVA's loss, as
    Megatron-LM's pretrain_vlm, skips the rerun machine's checks."""
    from mtmegatron.data.section import Batches
    from mtmegatron.tasks.llava.data import VisionReader
    from mtmegatron.tasks.llava.step import llava_step
    from mtmegatron.tasks.section import VisionReading
    from mtmegatron.training.section import Schedule
    from mtmegatron.training.train_step import lm_step

    resilience = cfg.of(Resilience)
    reader = VisionReader(cfg.of(Batches), 1, cfg.of(VisionReading))
    assert lm_step(cfg.of(Schedule)).loss_validated and not llava_step(reader).loss_validated
    assert "(LLaVA: gradients only, as Megatron-LM's pretrain_vlm)" in rerun.describe(resilience, False)
    assert "LLaVA" not in rerun.describe(resilience, True)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sections2")
    return config.parse(["--log-dir", str(tmp), "--save", str(tmp / "ckpt"), "--keep-last", "2",
                         "--non-persistent-save-interval", "5", "--non-persistent-ckpt-type", "global",
                         "--no-load-optim", "--dist-ckpt-strictness", "log_all", "--ckpt-fully-parallel-load",
                         "--log-throughput", "--log-interval", "3", "--timing-log-level", "2", "--manual-gc",
                         "--manual-gc-interval", "4", "--log-memory-interval", "6", "--log-progress"])


def test_checkpoint_and_observability_hold_the_flag_values(run):
    checkpoint, observability = run.of(Checkpoint), run.of(Observability)
    assert (checkpoint.save, checkpoint.keep_last, checkpoint.non_persistent_save_interval,
            checkpoint.non_persistent_ckpt_type, checkpoint.no_load_optim, checkpoint.dist_ckpt_strictness,
            checkpoint.ckpt_fully_parallel_load) == (run.args.save, 2, 5, "global", True, "log_all", True)
    assert checkpoint.save.endswith("ckpt")
    assert (observability.log_throughput, observability.log_interval, observability.timing_log_level,
            observability.manual_gc, observability.manual_gc_interval, observability.log_memory_interval,
            observability.log_progress, observability.save) == (True, 3, 2, True, 4, 6, True, run.args.save)
    for section in (Checkpoint, Observability, Shape):
        made = run.of(section)
        assert all(getattr(made, f.name) is getattr(run.args, f.name) for f in dataclasses.fields(section))
        assert made == section.of(argparse.Namespace(**vars(run.args)))  # compared by value


def test_the_non_persistent_checkpoints_follow_the_section(run):
    checkpoint = run.of(Checkpoint)
    directory = non_persistent.directory(checkpoint, checkpoint.save)
    assert directory == str(Path(checkpoint.save) / "non_persistent")
    assert [non_persistent.due(checkpoint, it) for it in (5, 7, 10)] == [True, False, True]
    assert non_persistent.kept(checkpoint, directory) == 1 and non_persistent.kept(checkpoint, checkpoint.save) == 2
    assert non_persistent.startup_lines(checkpoint) == [
        f"mtmegatron: non-persistent checkpoints every 5 iterations in {directory} (only the newest kept)"]


class _Reads:
    """The values an object gives, recording the names read."""

    def __init__(self, values):
        self.values, self.names = values, set()

    def __getattr__(self, name):
        self.names.add(name)
        return getattr(self.values, name)


def test_shape_holds_every_value_megatron_lms_formula_reads(run):
    """Dense, GQA with an output gate, MLA with and without a query LoRA, MoE by frequency and by pattern with
    shared experts, MTP: each branch of throughput.py reads only Shape's fields, and Shape gives the figure the
    run's args give."""
    base = {f.name: getattr(run.args, f.name) for f in dataclasses.fields(Shape)}
    layers = base["num_layers"]
    variants = [{}, {"attention_output_gate": True, "kv_channels": None},
                {"multi_latent_attention": True, "q_lora_rank": None},
                {"multi_latent_attention": True, "q_lora_rank": 16},
                {"num_experts": 4, "moe_layer_freq": 2, "moe_ffn_hidden_size": 64},
                {"num_experts": 4, "moe_layer_freq": [0] + [1] * (layers - 1),
                 "moe_shared_expert_intermediate_size": 32, "mtp_num_layers": 1}]
    figures = set()
    for variant in variants:
        values = _Reads(argparse.Namespace(**{**vars(run.args), **variant}))
        flops = throughput.num_floating_point_operations(values, 8)
        assert values.names <= set(base), f"{variant}: not in Shape: {values.names - set(base)}"
        assert throughput.num_floating_point_operations(Shape.of(values.values), 8) == flops
        figures.add(flops)
    assert len(figures) == len(variants)  # every variant took its own branch


# modules of the moved packages whose subject is the run's Namespace itself: Megatron-LM's checkpoint stores it
# as ``args`` (and --use-checkpoint-args sets it at parse time); upcycling builds the dense twin from a copy
MOVED = ("training/checkpoint", "training/observability", "training/resilience")
NAMESPACE_IS_THE_SUBJECT = {"training/checkpoint/megatron_lm_checkpoint.py", "training/checkpoint/upcycling.py"}


def test_the_moved_packages_read_no_args():
    import re

    modules = [path for package in MOVED for path in (PACKAGE / package).glob("*.py")]
    readers = sorted(str(path.relative_to(PACKAGE)) for path in modules if re.search(r"\bargs\.\w", path.read_text()))
    assert readers == sorted(NAMESPACE_IS_THE_SUBJECT)


def test_model_build_and_fusions_hold_the_flag_values_and_their_modules_read_no_args():
    """GPT-OSS's YaRN values and GPTModel's arguments reach the build as ``ModelBuild``; the fusion decisions
    from ``Fusions`` are those of the run's flags; the modules moved onto them (or onto plain values) read no
    ``args.<name>``."""
    import re

    from mtmegatron.models import fusions
    from mtmegatron.models.section import Fusions, ModelBuild

    run = config.parse(["--model", "gpt-oss", "--model-size", "tiny", "--no-bias-dropout-fusion",
                        "--cross-entropy-loss-fusion"])
    build, fused = run.of(ModelBuild), run.of(Fusions)
    assert (build.model, build.rope_type, build.untie_embeddings_and_output_weights) == ("gpt-oss", "yarn", True)
    assert build.padded_vocab_size >= build.vocab_size == run.args.vocab_size
    for section, made in ((ModelBuild, build), (Fusions, fused)):
        assert all(getattr(made, f.name) is getattr(run.args, f.name) for f in dataclasses.fields(section))
    assert not fused.bias_dropout_fusion and fusions.uses_our_cross_entropy(fused)
    assert fusions.decide(fused) == fusions.decide(run.args)
    moved = ["models/fusions.py", "models/moe_layers.py", "models/grouped_experts.py",
             "models/families/gpt_oss/rope.py", "models/families/shared/mtp.py"]
    assert [m for m in moved if re.search(r"\bargs\.\w", (PACKAGE / m).read_text())] == []


def test_data_sft_and_packing_sections_hold_the_flag_values_and_their_modules_read_no_args():
    """The data sections (data/section.py), ``Sft`` and the packed-vision ``Packing`` hold the values the flags
    gave; the sample plan and the tokenizer flags line read them as they read the run's args; the modules moved
    onto them read no ``args.<name>``."""
    import re

    from mtmegatron.data.position import SamplePlan
    from mtmegatron.data.section import Batches, GptData, Splits, Tokenizer
    from mtmegatron.data.tokenizer_build import tokenizer_flags_text
    from mtmegatron.sft.section import Sft
    from mtmegatron.tasks.qwen_vl.section import Packing
    from mtmegatron.tasks.registry import task_name
    from mtmegatron.tasks.section import RunKind

    run = config.parse(["--model", "llama3", "--model-size", "tiny", "--sft", "--no-sft-packing", "--seq-length", "64",
                        "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
                        "--rampup-batch-size", "4", "4", "16", "--train-samples", "64", "--iterations-to-skip", "2", "--split", "90,10,0", "--tokenizer-type", "NullTokenizer",
                        "--vocab-size", "300", "--num-dataset-builder-threads", "3"], world_size=2)
    sections = [run.of(s) for s in (Batches, GptData, Splits, Tokenizer, Sft, Packing)]
    for made in sections:
        assert all(getattr(made, f.name) is getattr(run.args, f.name) for f in dataclasses.fields(made))
    batches, builder, splits, tokenizer, sft, packing = sections
    assert (batches.global_batch_size, batches.rampup_batch_size, batches.iterations_to_skip) == (8, [4, 4, 16], [2])
    assert (builder.num_dataset_builder_threads, splits.split, sft.sft_packing, packing.seq_length) == (
        3, "90,10,0", False, 64)
    plan = SamplePlan(batches, 2)
    # the ramp: 4 samples a batch until 16 are consumed, then 8; iteration 3 (2 done before it) consumed untrained
    assert [(b.size, b.skipped, b.num_microbatches) for b in itertools.islice(plan, 6)] == [
        (4, False, 1), (4, False, 1), (4, True, 1), (4, False, 1), (8, False, 2), (8, False, 2)]
    assert tokenizer_flags_text(tokenizer, None) == "--tokenizer-type NullTokenizer --vocab-size 300"
    assert run.task == task_name(RunKind.of(run.args)) == "sft"
    moved = ["data/dataset_fields.py", "data/position.py", "data/splits.py", "data/tokenizer_build.py",
             "sft/dataset.py", "sft/accuracy.py", "sft/report.py", "training/sft_step.py", "tasks/qwen_vl/thd.py",
             "tasks/qwen_vl/step.py", "data/vision/build.py", "tasks/registry.py"]
    assert [m for m in moved if re.search(r"\bargs\.\w", (PACKAGE / m).read_text())] == []


def test_training_sections_hold_the_flag_values_and_drive_the_schedule_and_layout():
    """training/section.py: Parallel, LrSchedule and Schedule hold the values the flags gave; the process-group
    order, the wrapper and the scheduler's step counts follow them; the training modules moved onto them read no
    ``args.<name>`` (the three left fill megatron-core's configs by field name or hand ``init_distributed``'s
    callers the section: listed exactly)."""
    import re

    from mtmegatron.training.fsdp_engine import engine
    from mtmegatron.training.schedule_steps import scheduler_steps
    from mtmegatron.training.section import LrSchedule, Parallel, Schedule
    from mtmegatron.training.setup import parallel_order

    run = config.parse(["--tensor-model-parallel-size", "2", "--use-tp-pp-dp-mapping", "--ddp-num-buckets", "3",
                        "--overlap-grad-reduce", "--no-align-grad-reduce", "--lr", "0.01", "--min-lr", "0.001",
                        "--lr-warmup-iters", "2", "--train-iters", "20", "--global-batch-size", "8",
                        "--eval-interval", "5", "--eval-iters", "3", "--save-interval", "4", "--max-skipped-steps", "2"],
                       world_size=2)
    sections = [run.of(s) for s in (Parallel, LrSchedule, Schedule)]
    for made in sections:
        assert all(getattr(made, f.name) is getattr(run.args, f.name) for f in dataclasses.fields(made))
    parallel, lr, schedule = sections
    assert (parallel.tensor_model_parallel_size, parallel.ddp_num_buckets, parallel.overlap_grad_reduce,
            parallel.align_grad_reduce) == (2, 3, True, False)
    assert (parallel_order(parallel), engine(parallel)) == ("tp-cp-ep-pp-dp", "ddp")
    assert (lr.lr, lr.min_lr, schedule.eval_interval, schedule.eval_iters, schedule.save_interval,
            schedule.max_skipped_steps) == (0.01, 0.001, 5, 3, 4, 2)
    steps = scheduler_steps(lr)  # samples: iterations x global batch
    assert (steps["lr_warmup_steps"], steps["lr_decay_steps"], steps["wd_incr_steps"]) == (16, 160, 160)
    top = sorted(path.name for path in (PACKAGE / "training").glob("*.py")
                 if re.search(r"\bargs\.\w", path.read_text()))
    assert top == ["optimizer.py", "overlap.py", "setup.py"]


def test_a_task_is_built_once_from_the_run_and_its_modules_read_no_args(tmp_path):
    """``TASKS[name].of(values, embedded_corpus)`` keeps the sections the task reads, filled with the flags'
    values (the text task's reader sections, its outputs and samples; a vision task's reading and outputs); the
    readers hold what they read; tasks/ reads ``args.<name>`` only where the data completes the flags
    (qwen_vl/data.py) and in ``generate``'s Namespace (generate_images.py)."""
    import re

    from mtmegatron.tasks.registry import TASKS
    from mtmegatron.training.data import TextReader

    run = config.parse(["--num-workers", "3", "--seed", "7", "--num-samples", "2", "--sample-prompt", "Hi",
                        "--log-dir", str(tmp_path)], world_size=1)
    text = TASKS["text"].of(run.args, embedded_corpus=True)
    assert (text.loader.num_workers, text.loader.seed, text.samples.num_samples, text.samples.sample_prompt,
            text.outputs.log_dir, text.embedded_corpus) == (3, 7, 2, ["Hi"], str(tmp_path), True)
    for section in (text.kind, text.schedule, text.batches, text.loader, text.resilience, text.outputs, text.samples):
        assert all(getattr(section, f.name) is getattr(run.args, f.name) for f in dataclasses.fields(section))
    assert TextReader.of(run.args, 1) == TextReader(text.batches, 1, text.loader, text.resilience)
    vision = TASKS["llava"].of(run.args, embedded_corpus=False)
    assert (vision.reading.seed, vision.reading.balance_micro_batches, vision.vision_outputs.num_samples) == (7, False, 2)
    readers = sorted(str(p.relative_to(PACKAGE / "tasks")) for p in (PACKAGE / "tasks").rglob("*.py")
                     if re.search(r"\bargs\.\w", p.read_text()))
    assert readers == ["qwen_vl/data.py", "qwen_vl/generate_images.py"]


def test_the_hf_maps_read_the_model_config_build_and_family_section_not_args():
    """convert/ fills what the families' HF config and map read once (convert/model.hf_inputs): megatron-core's
    TransformerConfig, ModelBuild and the family's own section; the modules on them read no ``args.<name>``."""
    import re

    from mtmegatron.convert.model import hf_inputs, parse_flags
    from mtmegatron.models import families
    from mtmegatron.models.families.qwen2_vl.section import QwenVlHf
    from mtmegatron.models.section import ModelBuild

    batch = ["--micro-batch-size", "1", "--global-batch-size", "1"]
    args = parse_flags(["--model", "qwen2-vl", "--model-size", "tiny", *batch])
    inputs = hf_inputs(args)
    assert inputs["section"] == QwenVlHf.of(args) and inputs["build"] == ModelBuild.of(args)
    assert (inputs["config"].num_layers, inputs["config"].hidden_size) == (args.num_layers, args.hidden_size)
    hf = families.get("qwen2-vl").hf_config(**inputs)
    assert (hf["image_token_id"], hf["vision_config"]["depth"]) == (args.image_token_id, args.vision_num_layers)
    assert hf_inputs(parse_flags(["--model", "llama3", "--model-size", "tiny", *batch]))["section"] is None
    moved = ["models/families/gpt.py", "models/families/mixtral.py", "models/families/qwen3_moe.py",
             "models/families/glm4_moe.py", "models/families/deepseek_v3/__init__.py",
             "models/families/gpt_oss/__init__.py", "models/families/llava/__init__.py",
             "models/families/qwen2_vl/__init__.py", "models/families/qwen2_vl/qwen2_5_vl.py",
             "models/families/gemma3/hf.py", "convert/llava.py"]
    assert [m for m in moved if re.search(r"\bargs\.\w", (PACKAGE / m).read_text())] == []
