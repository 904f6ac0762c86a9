"""monarch_kernel.job: Monarch's job shapes (no hosts are started here; the
multi-host tests spawn meshes on the test cluster)."""

from __future__ import annotations

import os

import pytest

from monarch_kernel.errors import MeshSpecError
from monarch_kernel.job import JobState, LocalJob, SlurmJob, SSHJob, job_load, job_loads


def test_a_job_is_applied_once_and_its_state_names_its_host_meshes():
    job = SSHJob(meshes={"trainers": ["node1", "node2"], "data": ["node3"]}, python="/venv/bin/python")
    assert not job.active
    state = job.state(cached_path=None)
    assert job.active
    assert state.trainers.sizes == {"hosts": 2}
    assert state.data.sizes == {"hosts": 1}
    assert "node1, node2" in repr(state.trainers)
    with pytest.raises(AttributeError, match="'nope' is not a host mesh of this job .*data, trainers"):
        _ = state.nope


def test_slicing_a_host_mesh_picks_its_hosts():
    hosts = SSHJob(hosts=["a", "b", "c"]).state(cached_path=None).hosts
    assert "b, c" in repr(hosts.slice(hosts=slice(1, 3)))
    assert repr(hosts.slice(hosts=2)).endswith("over ssh: c>")
    slurm = SlurmJob(meshes={"trainers": 4}).state(cached_path=None).trainers
    assert "2 SLURM nodes" in repr(slurm.slice(hosts=slice(0, 2)))


def test_a_job_is_saved_and_loaded_with_its_specification(tmp_path):
    job = SlurmJob(meshes={"trainers": 2}, partition="gpu", time_limit="02:00:00", gpus_per_node=8)
    path = tmp_path / "job.pkl"
    job.state(cached_path=str(path))  # applied, then saved
    again = job_load(str(path))
    assert isinstance(again, SlurmJob) and again.active
    assert again.can_run(job) and job.can_run(again)
    assert job_loads(job.dumps()).can_run(job)
    assert not job.can_run(SlurmJob(meshes={"trainers": 3}))
    with pytest.raises(TypeError, match="not a job"):
        job_loads(b"\x80\x04K\x01.")  # pickle of 1


def test_bad_job_specifications_say_what_is_wrong():
    with pytest.raises(MeshSpecError, match="positive number of nodes"):
        SlurmJob(meshes={"trainers": 0})
    with pytest.raises(MeshSpecError, match="list of host names"):
        SSHJob(hosts=[])
    with pytest.raises(MeshSpecError, match="cannot have a 'hosts' dimension"):
        SSHJob(hosts=["a"]).state(cached_path=None).hosts.spawn_procs(per_host={"hosts": 2})


def test_a_local_job_is_this_host():
    state = LocalJob(hosts=("a", "b")).state(cached_path=None)
    assert isinstance(state, JobState)
    assert repr(state.a) == "<HostMesh: this host>"


def test_slurm_job_takes_monarchs_arguments_in_monarchs_order():
    # Monarch's examples pass (meshes, python_exe, slurm_args) by position and the
    # rest by name: job_name, log_dir, exclusive, cpus_per_task, mem, ...
    job = SlurmJob({"trainers": 2}, "/venv/bin/python", ["--comment=x"], None, "train", 1, "01:00:00", "gpu")
    again = SlurmJob(
        meshes={"trainers": 2},
        python_exe="/venv/bin/python",
        slurm_args=["--comment=x"],
        job_name="train",
        time_limit="01:00:00",
        partition="gpu",
    )
    assert job.can_run(again)
    assert not job.can_run(SlurmJob({"trainers": 2}, "/venv/bin/python", ["--comment=x"], job_name="other"))
    job.add_mesh("data", 1)
    assert job.state(cached_path=None).data.sizes == {"hosts": 1}
    with pytest.raises(MeshSpecError, match="positive number of nodes"):
        job.add_mesh("bad", 0)


@pytest.mark.parametrize(
    "option, says",
    [
        ({"monarch_port": 22222}, "listens on a free port"),
        ({"ntasks_per_node": 2}, "one host agent runs per node"),
        ({"out_of_cluster": True}, "talks to each node's agent directly"),
        ({"attach_to": "tcp://login:22222"}, "talks to each node's agent directly"),
        ({"bind_to": "0.0.0.0"}, "talks to each node's agent directly"),
    ],
)
def test_slurm_job_options_with_no_meaning_here_are_refused_with_why(option, says):
    with pytest.raises(MeshSpecError, match=says):
        SlurmJob(meshes={"trainers": 2}, **option)


def test_the_current_job_is_named_by_module_and_gives_hosts_from_config(tmp_path, monkeypatch):
    from monarch_kernel.job import DEFAULT_JOB_PATH, hosts_from_config, load_current_job, set_current_job

    monkeypatch.chdir(tmp_path)
    assert repr(hosts_from_config("trainers")) == "<HostMesh: this host>"  # no job: this host
    with pytest.raises(FileNotFoundError, match="set_current_job"):
        load_current_job()
    (tmp_path / "myjobs.py").write_text(
        "from monarch_kernel.job import SSHJob\njob = SSHJob(meshes={'trainers': ['n1', 'n2']})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    set_current_job("myjobs.job")
    assert os.path.islink(DEFAULT_JOB_PATH)
    assert isinstance(load_current_job(), SSHJob)
    assert hosts_from_config("trainers").sizes == {"hosts": 2}
    assert os.path.exists(DEFAULT_JOB_PATH)  # state() saved the applied job in the context
    with pytest.raises(MeshSpecError, match="module.attr"):
        set_current_job("myjobs")


def test_span_and_traced_log_their_work(caplog):
    import asyncio

    from monarch_kernel import span, traced

    @traced
    def work() -> int:
        return 1

    @traced(name="fetch")
    async def fetch() -> int:
        return 2

    with caplog.at_level("DEBUG", logger="monarch_kernel.telemetry"):
        with span("step"):
            assert work() == 1
        assert asyncio.run(fetch()) == 2
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" took")[0] for m in said if " took " in m] == ["span work", "span step", "span fetch"], (
        said
    )


def test_a_slurm_meshs_hosts_are_in_slurms_node_order_numbers_by_value():
    from monarch_kernel.hosts._slurm import node_order

    names = ["h10", "h2", "h1", "gpu-b-03", "gpu-a-12", "gpu-a-3", "h64", "login"]
    assert sorted(names, key=node_order) == [
        "gpu-a-3", "gpu-a-12", "gpu-b-03", "h1", "h2", "h10", "h64", "login",
    ]  # fmt: skip
