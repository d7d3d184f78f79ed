"""Tests of the distributed-config rules (``shardwise.train.config_rules``): the world, ranks and
their defaults from torchrun's variables, the mesh spellings and their errors, and the
tensor-parallel refusals, each naming the key and the fix."""

from conftest import load_train_config as load
from conftest import train_config_error as error_of
from shardwise.train.config import TrainConfig


def test_the_distributed_layout_is_accepted_with_derived_values():
    cfg = load(
        "distributed.world_size=8",
        "distributed.num_nodes=2",
        "distributed.num_processes_per_node=4",
        "distributed.pipeline_parallel_size=2",
        env={"RANK": "5", "LOCAL_RANK": "1"},
    )
    d = cfg.distributed
    assert d.get_data_parallel_size() == 4 == cfg.data_parallel_size
    assert d.strategy == "pipeline"  # derived from pipeline_parallel_size > 1
    assert not d.is_main_process() and not d.is_local_main_process()


def test_rule_world_size_equals_nodes_times_processes():
    message = error_of(
        "distributed.world_size=8",
        "distributed.num_nodes=2",
        "distributed.num_processes_per_node=3",
    )
    assert "world_size == num_nodes * num_processes_per_node" in message
    assert "distributed.num_processes_per_node=3" in message


def test_rule_tensor_times_pipeline_at_most_world_size():
    message = error_of("distributed.world_size=2", "distributed.pipeline_parallel_size=4")
    assert "tensor_parallel * pipeline_parallel <= world_size" in message
    assert "4 > distributed.world_size=2" in message


def test_rule_rank_below_world_size():
    message = error_of("distributed.world_size=4", "distributed.rank=4")
    assert "rank < world_size" in message and "distributed.rank=4" in message
    assert "rank < world_size" in error_of(env={"WORLD_SIZE": "2", "RANK": "2"})


def test_world_size_rank_and_local_rank_default_from_torchrun_env():
    env = {"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    d = load(env=env).distributed
    assert (d.world_size, d.rank, d.local_rank) == (4, 0, 0)
    assert (d.num_nodes, d.num_processes_per_node) == (2, 2)
    assert d.is_main_process() and d.is_local_main_process() and d.enabled


def test_resolution_does_not_leak_between_configs():
    first = load(env={"WORLD_SIZE": "4"})
    second = load()
    assert (first.distributed.world_size, second.distributed.world_size) == (4, 1)
    assert TrainConfig().distributed.world_size is None


def test_explicit_world_size_must_match_the_launcher():
    message = error_of("distributed.world_size=2", env={"WORLD_SIZE": "4"})
    assert "distributed.world_size=2" in message and "WORLD_SIZE=4" in message


def test_every_example_mesh_validates():
    """[[1,2]], [[2,1]], [[2,2]] fsdp x tp, and [[8,2]] for 16 ranks on 2 nodes."""
    cfg = load("distributed.world_size=2", 'model.mesh_shape=[[1,2],["fsdp","tp"]]')
    assert (cfg.distributed.tensor_parallel_size, cfg.distributed.strategy) == (2, "ddp")
    cfg = load("distributed.world_size=2", 'model.mesh_shape=[[2,1],["fsdp","tp"]]')
    assert (cfg.distributed.tensor_parallel_size, cfg.distributed.strategy) == (1, "fsdp")
    cfg = load("distributed.world_size=4", 'model.mesh_shape=[[2,2],["fsdp","tp"]]')
    assert (cfg.distributed.tensor_parallel_size, cfg.distributed.strategy) == (2, "fsdp")
    assert cfg.data_parallel_size == 2
    cfg = load(
        "distributed.world_size=16",
        "distributed.num_nodes=2",
        'model.mesh_shape=[[8,2],["fsdp","tp"]]',
        "model.heads=8",
    )
    assert (cfg.distributed.tensor_parallel_size, cfg.data_parallel_size) == (2, 8)


def test_distributed_axis_names_and_sizes():
    cfg = load(
        "distributed.world_size=4",
        "distributed.mesh_shape=[2,2]",
        "distributed.mesh_axis_names=[data,model]",
    )
    assert cfg.distributed.tensor_parallel_size == 2 and cfg.data_parallel_size == 2
    cfg = load("distributed.world_size=4", "distributed.tensor_parallel_size=2")
    assert cfg.distributed.strategy == "ddp" and cfg.data_parallel_size == 2


def test_tensor_parallel_refusals_name_the_key_and_the_fix():
    mesh = 'model.mesh_shape=[[1,4],["fsdp","tp"]]'
    message = error_of("distributed.world_size=4", mesh, "model.heads=6", "model.dim=96")
    assert "model.heads = 6 is not divisible by the tensor-parallel size 4" in message
    message = error_of("distributed.world_size=4", mesh, "model.vocab_size=258")
    assert "model.vocab_size = 258" in message and "choose a tp size" in message
    message = error_of(
        "distributed.world_size=4", mesh, "distributed.sequence_parallel=true", "data.seq_len=30"
    )
    assert "data.seq_len (sequence parallelism) = 30" in message
    message = error_of("distributed.world_size=2", "distributed.sequence_parallel=true")
    assert "needs tensor parallelism" in message
    message = error_of(
        "distributed.world_size=2",
        mesh.replace("1,4", "1,2"),
        "distributed.sequence_parallel_save_gathered=true",
    )
    assert "needs distributed.sequence_parallel=true" in message
    message = error_of("distributed.world_size=4", mesh, "distributed.strategy=zero")
    assert "ZeRO over a data axis of size 1 partitions nothing" in message
    assert "strategy ddp with tp=4" in message
    message = error_of(
        "distributed.world_size=4",
        'model.mesh_shape=[[2,2],["dp","tp"]]',
        "distributed.strategy=fsdp",
    )
    assert "name it 'fsdp'" in message
    # an fsdp axis of size 1 shards nothing, as torch's FSDP at world 1: accepted, so each mesh
    # of the mesh guide runs over an FSDP config as written
    cfg = load("distributed.world_size=2", mesh.replace("1,4", "1,2"), "distributed.strategy=fsdp")
    assert cfg.data_parallel_size == 1 and cfg.distributed.tensor_parallel_size == 2


def test_mesh_product_must_equal_world_size():
    message = error_of("distributed.world_size=4", 'model.mesh_shape=[[2,1],["fsdp","tp"]]')
    assert "model.mesh_shape" in message and "world_size=4" in message


def test_mesh_axis_names_are_checked():
    message = error_of("distributed.world_size=2", 'model.mesh_shape=[[2],["tensor"]]')
    assert "'tensor'" in message and "fsdp, dp, tp, pp" in message


def test_mesh_in_model_and_distributed_must_agree():
    message = error_of(
        "distributed.world_size=2",
        'model.mesh_shape=[[2,1],["fsdp","tp"]]',
        'distributed.mesh_shape=[[2,1],["dp","tp"]]',
    )
    assert "model.mesh_shape" in message and "distributed.mesh_shape" in message


def test_distributed_mesh_shape_with_axis_names():
    cfg = load(
        "distributed.world_size=4",
        "distributed.mesh_shape=[2,2]",
        'distributed.mesh_axis_names=["dp","pp"]',
    )
    assert cfg.mesh() == [[2, 2], ["dp", "pp"]]
    assert cfg.distributed.strategy == "pipeline"
    layout = cfg.layout()
    assert (layout.pipeline_parallel_size, layout.data_parallel_size) == (2, 2)
    assert layout.data_axis("pipeline") == "dp"


def test_lamb_with_hybrid_sharding_or_zero_over_tp_is_refused_before_start():
    """training.optimizer=lamb where its trust ratio would count a piece twice (hybrid
    sharding's replicas) or miss the tp group (ZeRO over a tp axis): refused, naming the key
    and the fix; full sharding over the same world is accepted."""
    hybrid = ("distributed.world_size=4", 'model.mesh_shape=[[2,2],["dp","fsdp"]]',
              "distributed.strategy=fsdp", "training.optimizer=lamb")  # fmt: skip
    message = error_of(*hybrid, "distributed.fsdp.fsdp_sharding_strategy=hybrid_shard")
    assert "training.optimizer=lamb" in message and "full_shard" in message
    message = error_of("distributed.world_size=4", 'model.mesh_shape=[[2,2],["dp","tp"]]',
                       "distributed.strategy=zero", "training.optimizer=lamb")  # fmt: skip
    assert "strategy zero and a tp axis" in message
    cfg = load("distributed.world_size=4", "distributed.strategy=fsdp", "training.optimizer=lamb")
    assert cfg.training.optimizer == "lamb"


PP2 = ("distributed.world_size=2", "distributed.pipeline_parallel_size=2")


def test_deterministic_refuses_what_its_tree_does_not_cover():
    """training.deterministic: each refusal names the key and the fix, before anything runs
    (an accepted option the mode would ignore, or a world its tree cannot split, would break
    the bit-identity the mode promises)."""
    on = "training.deterministic=true"
    cases = [
        (("distributed.world_size=3", "distributed.strategy=ddp"), "power-of-two data-parallel"),
        ((*PP2, 'model.mesh_shape=[[2,2],["fsdp","pp"]]', "distributed.world_size=4"),
         "use a dp axis instead"),
        ((*PP2, "distributed.pipeline.schedule=zb_h1"), "split backwards"),
        ((*PP2, "distributed.pipeline.num_microbatches=3"), "num_microbatches=3 with"),
        (("training.mixed_precision=fp16",), "covers fp32 and bf16"),
        (("training.gradient_accumulation_steps=2", "training.sync_gradients_every=1"),
         "training.sync_gradients_every=1 with training.deterministic"),
        (("distributed.world_size=2", "distributed.strategy=ddp", "distributed.ddp_comm_hook=bf16"),
         "distributed.ddp_comm_hook=bf16 with training.deterministic"),
        (("distributed.strategy=fsdp", "training.optimizer=lamb"), "use adamw, or ddp"),
    ]  # fmt: skip
    for overrides, expected in cases:
        message = error_of(on, *overrides)
        assert expected in message, (overrides, message)
    assert load(on, "distributed.world_size=4", "distributed.strategy=zero").training.deterministic
    assert load(on, *PP2, "distributed.pipeline.num_microbatches=4").training.deterministic
