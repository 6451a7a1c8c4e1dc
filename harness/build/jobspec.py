"""JobSpec: everything one attempt needs, computed once.

``render`` writes a JobSpec to a job directory and ``submit`` submits exactly
those files; no sbatch directive or launch flag is computed anywhere else.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from harness import __version__
from harness.contract import envvars
from harness.contract.defaults import DEEPSPEED_BUCKET, ZERO3_PERSISTENCE
from harness.contract.paths import JobPaths, dataset_filename
from harness.spec.catalog import Experiment, get_experiment
from harness.spec.envs import envs_root, lookup
from harness.spec.flops import compute_dtype, peak_tflops
from harness.spec.inventory import Host, Inventory, Partition, shared_dir
from harness.spec.memory import config_for, predict
from harness.spec.plan import PlannedPoint
from harness.spec.resources import Counts, Share, per_device_batch, point_counts, point_share, threads_per_rank
from harness.spec.sweep import Sweep, data_dir_for

from .trainargs import for_fms_hf_tuning, train_argv

PORT_BASE, PORT_SPAN = 20000, 12000  # below Linux's ephemeral range (32768+)
DEFAULT_TIME = "01:00:00"


def request_time(sweep: Sweep, part: Partition) -> str:
    """A point's time limit (sbatch ``--time``): the sweep's ``slurm.time``, else the partition's ``time_limit``."""
    return sweep.slurm.time or part.time_limit or DEFAULT_TIME
RES_OPTIONS = "timeout:1 attempts:2"  # glibc resolver options of the job's processes (see _host_env)


def default_port(point_id: str, repeat: int, attempt: int) -> int:
    """A port spread by point and attempt; launch.sh replaces it with one derived from the SLURM job id."""
    h = int(hashlib.sha256(f"{point_id}.{repeat}.{attempt}".encode()).hexdigest(), 16)
    return PORT_BASE + h % PORT_SPAN


@dataclass
class JobSpec:
    campaign: str
    point_id: str
    repeat: int
    attempt: int
    experiment: str
    method: str
    entity: dict[str, Any]
    job_dir: str
    partition: str
    cpu_partition: bool
    model_source: str
    dataset_id: str
    dataset_path: str
    data_dir: str
    resources: dict[str, Any]
    launcher: str  # python | accelerate
    num_machines: int
    num_processes: int
    processes_per_node: int
    port: int
    accelerate_config: dict[str, Any] | None
    deepspeed_config: dict[str, Any] | None
    train_argv: list[str]
    python: str
    setup: list[str]
    env: dict[str, str]
    host_env: dict[str, dict[str, str]]
    host_addresses: dict[str, str]
    trials: int
    runner: dict[str, Any]
    adjustments: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sbench_version: str = __version__
    workload: str = "train"  # train | idle (runner.workload) | fabric (sbench fabric); see ``module``
    compute_dtype: str | None = None  # the dtype the peak is read for (harness.spec.flops)
    peak_tflops: float | None = None  # one device's peak dense TFLOP/s: MFU's denominator
    peak_source: str = "unknown"  # inventory | gpu_peaks.yaml | unknown
    price_per_gpu_hour: float | None = None  # the partition's price of one device an hour: the run's cost per token
    memory_prediction: dict[str, Any] | None = None  # harness.spec.memory's per-device prediction, for collect
    trainer: str = "sbench"  # sbench | fms-hf-tuning (the entity's trainer)
    # What the reference command line asks (Experiment.asked_settings), before a partition or an environment
    # changed it: the runner records what it used beside it.
    asked: dict[str, Any] = field(default_factory=dict)
    trainer_python: str | None = None  # the training processes' interpreter when it is not ``python``
    trainer_path: str | None = None  # PYTHONPATH holding only sbench's package, for that interpreter
    trainer_env: dict[str, Any] | None = None  # the trainer environment as render saw it (harness.trainerenv)
    node_share: dict[str, Any] | None = None  # the point's share of each node and --exclusive (spec.resources.Share)

    @property
    def module(self) -> str:
        """The Python module each process runs."""
        if self.workload == "train" and self.trainer == "fms-hf-tuning":
            return "harness.runner.fms"
        return {"fabric": "harness.runner.fabric", "idle": "harness.runner.idle"}.get(self.workload,
                                                                                       "harness.runner.train")

    @property
    def paths(self) -> JobPaths:
        return JobPaths(self.job_dir)

    def shape(self) -> tuple[tuple[str, Any], ...]:
        """Resource shape: points with equal shapes share one job array."""
        return tuple(sorted((k, v) for k, v in self.resources.items() if k not in ("job_name", "output")))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def scheduling(sweep: Sweep, part: Partition) -> dict[str, Any]:
    """account, qos and constraint: the sweep's, else the partition's."""
    out = {}
    for key in ("account", "qos", "constraint"):
        value = getattr(sweep.slurm, key) or getattr(part, key)
        if value:
            out[key] = value
    return out


def slurm_extra(sweep: Sweep, part: Partition) -> dict[str, Any]:
    """The partition's and then the sweep's extra sbatch options, as resource keys."""
    return {key.replace("-", "_"): value for key, value in {**part.slurm_extra, **sweep.slurm.extra}.items()}


def _resources(sweep: Sweep, part: Partition, counts: Counts, share: Share, job_dir: str,
               point: PlannedPoint, exclude: list[str] | None = None) -> dict[str, Any]:
    nodes = counts.nodes
    res: dict[str, Any] = {
        "job_name": f"sbench.{sweep.campaign}.{point.point_id[:8]}",
        "partition": part.slurm_partition,
        "nodes": nodes,
        "ntasks_per_node": 1,
    }
    if not part.is_cpu and counts.devices > 0:
        res["gpus_per_node"] = share.devices
    res["cpus_per_task"] = share.cpus
    res["mem"] = share.mem
    res["time"] = request_time(sweep, part)
    res.update(scheduling(sweep, part))
    # Isolation by default (harness.spec.resources.exclusive): a whole node, an exclusive partition and a
    # multi-node RoCE point own their nodes; the sweep's slurm.exclusive decides for all of its points.
    if share.exclusive:
        res["exclusive"] = True
    # Only inventory hosts: when the point needs every host, name them; otherwise the submit-time view of
    # the SLURM partition (if a controller answers) excludes its other nodes (harness.cluster.fit).
    # A host excluded for itself (a slow device, submit --exclude-slow) is never named.
    if nodes == len(part.hosts) and not set(exclude or ()) & set(part.hosts):
        res["nodelist"] = ",".join(sorted(part.hosts))
    elif exclude:
        res["exclude"] = ",".join(sorted(exclude))
    # One attempt is one execution unless the sweep opts in: a node failure is a failed attempt that
    # `sbench retry` resubmits with a fresh job dir. With requeue on, a requeued job continues in the
    # same job dir (stage events carry SLURM_RESTART_COUNT).
    res["requeue" if sweep.slurm.requeue else "no_requeue"] = True
    res.update(slurm_extra(sweep, part))
    res["output"] = f"{job_dir}/slurm-%j.out"
    return res


def _fsdp_block(e: dict[str, Any], cpu: bool, adjustments: list[str]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_forward_prefetch": False,
        "fsdp_offload_params": bool(e.get("fsdp_offload_params", False)),
        "fsdp_sharding_strategy": e.get("fsdp_sharding_strategy", "FULL_SHARD"),
        "fsdp_state_dict_type": e.get("fsdp_state_dict_type", "FULL_STATE_DICT"),
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_sync_module_states": True,
    }
    wrap = e.get("accelerate_config_fsdp_transformer_layer_cls_to_wrap")
    if wrap:
        cfg["fsdp_transformer_layer_cls_to_wrap"] = wrap
    if cpu:
        # FSDP v1 needs an accelerator; v2 (fully_shard) runs on CPU over gloo. v2 has no prefetch or
        # sync_module_states knobs and expresses the sharding strategy as reshard_after_forward.
        strategy = cfg.pop("fsdp_sharding_strategy")
        for k in ("fsdp_backward_prefetch", "fsdp_forward_prefetch", "fsdp_sync_module_states"):
            cfg.pop(k)
        cfg["fsdp_version"] = 2
        cfg["fsdp_reshard_after_forward"] = strategy in ("FULL_SHARD", "HYBRID_SHARD")
        if cfg["fsdp_state_dict_type"] == "LOCAL_STATE_DICT":
            cfg["fsdp_state_dict_type"] = "SHARDED_STATE_DICT"
            adjustments.append("cpu partition: FSDP v2 has no LOCAL_STATE_DICT; using SHARDED_STATE_DICT")
        adjustments.append(f"cpu partition: FSDP v2 (fsdp_reshard_after_forward="
                           f"{str(cfg['fsdp_reshard_after_forward']).lower()} for {strategy})")
    return cfg


def deepspeed_config(e: dict[str, Any], part: Partition, per_device_bs: int, devices: int,
                     adjustments: list[str]) -> dict[str, Any]:
    """The DeepSpeed config of a DEEPSPEED point, with concrete values only (no ``"auto"``), so that
    deepspeed's own ``DeepSpeedConfig`` accepts it as it stands. Every value the HF Trainer also sets
    (micro batch, accumulation, clipping, bf16/fp16) equals what the sbench trainer passes it, which the
    Trainer checks at start-up."""
    stage = int(e.get("deepspeed_zero_stage") or 2)
    ga = int(e.get("gradient_accumulation_steps") or 1)
    bf16 = bool(e.get("bf16")) and not part.is_cpu  # the trainer turns bf16 off without CUDA
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": not part.is_cpu, "contiguous_gradients": True,
                            "reduce_bucket_size": DEEPSPEED_BUCKET, "allgather_bucket_size": DEEPSPEED_BUCKET}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=DEEPSPEED_BUCKET, stage3_param_persistence_threshold=ZERO3_PERSISTENCE,
                    stage3_gather_16bit_weights_on_model_save=False)
    if e.get("deepspeed_offload_optimizer"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": not part.is_cpu}
    if e.get("deepspeed_offload_params") and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": not part.is_cpu}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": per_device_bs,
        "gradient_accumulation_steps": ga,
        "train_batch_size": per_device_bs * ga * devices,
        "gradient_clipping": 1.0,  # the trainer's max_grad_norm
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": False},
        "zero_optimization": zero,
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    if e.get("deepspeed_offload_optimizer"):
        # The point's optim stays the optimizer (DeepSpeed would otherwise insist on its own CPU Adam).
        cfg["zero_force_ds_cpu_optimizer"] = False
        adjustments.append(f"deepspeed: offloaded optimizer state is stepped by {e.get('optim') or 'adamw_torch'} "
                           "on the host (zero_force_ds_cpu_optimizer: false)")
    if part.is_cpu:
        adjustments.append("cpu partition: DeepSpeed's CPU accelerator over gloo; no overlap_comm or pinned memory")
    return cfg


def accelerate_config(e: dict[str, Any], part: Partition, num_machines: int, num_processes: int, port: int,
                      main_ip: str | None, adjustments: list[str], job_dir: str = ".") -> dict[str, Any]:
    """The accelerate config of the reference templates, field for field (FSDP or DDP); DEEPSPEED points
    name the job dir's deepspeed.json."""
    backend = e.get("distributed_backend") or "FSDP"
    mixed = e.get("accelerate_config_mixed_precision", "no")
    if part.is_cpu and mixed != "no":
        adjustments.append(f"cpu partition: accelerate mixed_precision {mixed} -> no")
        mixed = "no"
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE"}
    if backend == "DEEPSPEED":
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["downcast_bf16"] = "no"
        # "standard": torch.distributed.run on every node (the node runner starts one launcher per node),
        # not deepspeed's pdsh/ssh launcher.
        cfg["deepspeed_config"] = {"deepspeed_config_file": str(JobPaths(job_dir).deepspeed),
                                   "deepspeed_multinode_launcher": "standard", "zero3_init_flag": False}
    elif backend == "FSDP":
        cfg["distributed_type"] = "FSDP"
        cfg["downcast_bf16"] = "no"
        cfg["fsdp_config"] = _fsdp_block(e, part.is_cpu, adjustments)
    else:
        cfg["debug"] = False
        cfg["downcast_bf16"] = "no"
        # On a CPU partition DDP is still launched as MULTI_GPU (torch.distributed.run, one process per
        # worker, gloo because use_cpu is set): accelerate's MULTI_CPU launcher starts a single process.
        cfg["distributed_type"] = "MULTI_GPU"
        if part.is_cpu:
            adjustments.append("cpu partition: DDP launched as MULTI_GPU with use_cpu (gloo, one process per worker)")
    cfg.update({
        "machine_rank": 0,
        "main_training_function": "main",
        # DEEPSPEED: deepspeed.json carries bf16/fp16; accelerate refuses a mixed_precision beside a config file.
        **({} if backend == "DEEPSPEED" else {"mixed_precision": mixed}),
        "num_machines": num_machines,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": part.is_cpu,
    })
    if num_machines > 1 and main_ip:
        cfg["main_process_ip"] = main_ip
    cfg["main_process_port"] = port
    cfg["num_processes"] = num_processes
    return cfg


def fms_setup(exp: Experiment, e: dict[str, Any], part: Partition, inv: Inventory, argv: list[str],
              adjustments: list[str]) -> tuple[list[str], dict[str, Any]]:
    """The fms-hf-tuning trainer's command line (see :func:`harness.build.trainargs.for_fms_hf_tuning`) and its
    environment as render sees it."""
    version = str(e.get("fms_hf_tuning_version"))
    env = lookup(version, envs_root(inv))
    man = env.manifest or {}
    argv = for_fms_hf_tuning(argv, method=exp.method, fast_moe=int(e.get("fast_moe") or 0), cpu=part.is_cpu,
                             flash_attn="flash-attn" in (man.get("packages") or {}), version=version,
                             python=str(env.python), adjustments=adjustments)
    info = {"name": "fms-hf-tuning", "version": version, "path": str(env.path), "python": str(env.python),
            "built": env.built, "packages": man.get("trainer_packages"), "plugins": man.get("plugins"),
            "torch_cuda": (man.get("torch") or {}).get("cuda")}
    return argv, info


def _host_env(inv: Inventory, part: Partition, host: Host, e: dict[str, Any], job_dir: str,
              multi_node: bool) -> dict[str, str]:
    env: dict[str, str] = {}
    if multi_node:
        env["NCCL_DEBUG"] = "INFO"  # lets collect read which transport each node used
        if e.get("enable_roce") and host.roce is not None:
            env.update(inv.nccl)
            env["NCCL_IB_HCA"] = host.roce.nccl_ib_hca
            env["NCCL_IB_GID_INDEX"] = str(host.roce.gid_index)
            if host.roce.socket_ifname:
                env["NCCL_SOCKET_IFNAME"] = host.roce.socket_ifname
            env["NCCL_IB_DISABLE"] = "0"
            if host.nccl_topo_file:
                env["NCCL_TOPO_FILE"] = host.nccl_topo_file
            env["NCCL_DEBUG_SUBSYS"] = "INIT,BOOTSTRAP,ENV,NET"
        else:
            env["NCCL_IB_DISABLE"] = "1"
    else:
        env["NCCL_IB_DISABLE"] = "1"
    env["HF_DATASETS_CACHE"] = str(JobPaths(job_dir).hf_cache(host.name) / "datasets")
    # torch's TCPStore reverse-resolves every peer (an IPv4-mapped IPv6 address that /etc/hosts never
    # matches) only to log it; on nodes whose DNS server does not answer, glibc's default (5 s x 2)
    # holds each rendezvous for 10 s. Fail such lookups in 2 s at most; the inventory env can override.
    env["RES_OPTIONS"] = RES_OPTIONS
    if inv.models_dir:  # the shared model cache `sbench model fetch` and `sbench prepare` use
        env["HF_HUB_CACHE"] = str(shared_dir(inv.models_dir, inv))
        # Compute nodes load from it and never wait on the hub (prepare checked the weights are there).
        env["HF_HUB_OFFLINE"] = "1"
    if host.address:
        env[envvars.HOST_ADDRESS.name] = host.address
    env.update(host.env)  # the inventory's own per-host values win
    return env


def build_jobspec(sweep: Sweep, inv: Inventory, point: PlannedPoint, attempt: int, job_dir: str,
                  python: str | None = None, exclude: list[str] | None = None) -> JobSpec:
    """*exclude*: the SLURM partition's nodes that are not inventory hosts (from the controller, when it
    answers), kept out of a point that does not need every host."""
    exp = get_experiment(point.experiment)
    part = inv.partition(point.partition)
    e = dict(point.entity)
    counts = point_counts(e)
    nodes, devices, per_node = counts.nodes, counts.processes, counts.processes_per_node
    per_device_bs = per_device_batch(e)
    adjustments: list[str] = []
    deepspeed = e.get("distributed_backend") == "DEEPSPEED"
    launcher = "accelerate" if devices > 1 or deepspeed else "python"
    port = default_port(point.point_id, point.repeat, attempt)
    first_host = next(iter(part.hosts.values()))
    acc = ds = None
    if launcher == "accelerate":
        acc = accelerate_config(e, part, nodes, devices, port, first_host.address or first_host.name, adjustments,
                                job_dir)
    if deepspeed:
        ds = deepspeed_config(e, part, per_device_bs, devices, adjustments)
    if part.is_cpu:
        if e.get("torch_dtype") not in (None, "float32") or e.get("bf16"):
            adjustments.append("cpu partition: the runner loads float32 weights and turns bf16/fp16 and "
                               "flash-attention off when no CUDA device is present")
    data_dir = data_dir_for(sweep, inv)
    dataset_path = str(data_dir / dataset_filename(e.get("dataset_id") or "news-tokens-16384plus-entries-4096"))
    target = exp.target_modules(e["model_name"], sweep.model_map)
    argv = train_argv(exp, e, point.model_source or e["model_name"], dataset_path, job_dir, per_device_bs, target)
    if sweep.runner.workload == "idle":
        argv = ["--job-dir", job_dir, "--seconds", f"{sweep.runner.idle_seconds:g}"]
    trainer = str(e.get("trainer") or "sbench")
    tpython = tpath = tinfo = None
    if trainer == "fms-hf-tuning" and sweep.runner.workload == "train":
        argv, tinfo = fms_setup(exp, e, part, inv, argv, adjustments)
        tpython, tpath = tinfo["python"], str(JobPaths(job_dir).root / "pythonpath")
    cdtype = compute_dtype(e, part.is_cpu)
    peak, peak_src = peak_tflops(str(e.get("gpu_model") or part.gpu_model), cdtype, part.peak_tflops)
    mem = point.memory
    if mem is None and sweep.runner.workload == "train":
        arch, arch_source = config_for(e["model_name"], point.model_source or e["model_name"])
        mem = predict(e, exp.method, arch, part, config_source=arch_source,
                      target_modules=tuple(target or ()) if exp.method in ("lora", "gptq-lora") else ()).to_dict()
    env = dict(inv.env)
    env.update(part.env)
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(part, per_node)))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    host_env = {h.name: _host_env(inv, part, h, e, job_dir, nodes > 1) for h in part.hosts.values()}
    share = point_share(part, e, sweep.slurm.exclusive, sweep.slurm.mem_gb)
    return JobSpec(
        campaign=sweep.campaign, point_id=point.point_id, repeat=point.repeat, attempt=attempt,
        experiment=exp.id, method=exp.method, entity=e, job_dir=job_dir, partition=part.name,
        cpu_partition=part.is_cpu, model_source=point.model_source or e["model_name"],
        dataset_id=e.get("dataset_id") or "news-tokens-16384plus-entries-4096", dataset_path=dataset_path,
        data_dir=str(data_dir),
        resources=_resources(sweep, part, counts, share, job_dir, point, exclude),
        launcher=launcher, num_machines=nodes, num_processes=devices, processes_per_node=per_node, port=port,
        accelerate_config=acc, deepspeed_config=ds, train_argv=argv,
        python=python or part.python or inv.python or sys.executable,
        setup=list(inv.setup) + list(part.setup), env=env, host_env=host_env,
        compute_dtype=cdtype, peak_tflops=peak, peak_source=peak_src, memory_prediction=mem,
        price_per_gpu_hour=part.price_per_gpu_hour,
        host_addresses={h.name: h.address for h in part.hosts.values() if h.address},
        trials=exp.trials, runner=sweep.runner.for_repeat(point.repeat).to_dict(), adjustments=adjustments,
        notes=list(point.notes),
        workload=sweep.runner.workload, trainer=trainer, trainer_python=tpython, trainer_path=tpath,
        trainer_env=tinfo, node_share=share.to_dict(), asked=exp.asked_settings(e),
    )
