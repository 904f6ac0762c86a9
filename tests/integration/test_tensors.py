"""Distributed tensors (the tensor engine), on real workers, on the CPU: ops under
``activate()``, sync points, failures and recovery, collectives over mesh
dimensions, moving between meshes, ``remote``, autograd and training."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn

import monarch_kernel as mk
from monarch_kernel import ProcMesh, this_host
from monarch_kernel.errors import DimensionError, SupervisionError
from monarch_kernel.tensor import _ops as ops
from monarch_kernel.tensor._ops import memory

TIMEOUT = 60


@pytest.fixture(scope="module")
def grid(state_home: object) -> Iterator[ProcMesh]:
    """Four procs as a 2 x 2 mesh, ``{"host": 2, "gpu": 2}``."""
    procs = this_host().spawn_procs(per_host={"host": 2, "gpu": 2})
    try:
        yield procs
    finally:
        procs.stop()


def fetch(t: object, **coords: int) -> torch.Tensor:
    return mk.fetch_shard(t, coords).get(timeout=TIMEOUT)


def each(t: object, mesh: ProcMesh) -> list[torch.Tensor]:
    """The value on each proc of ``mesh``, in rank order."""
    return [fetch(t, **dict(p)) for p in mesh._shape.points()]


# -- ops and sync points ------------------------------------------------------------------


def test_ops_under_activate_run_on_every_proc_and_inspect_brings_one_procs_value(grid):
    with grid.activate():
        w = torch.rand(4, 4)
        r = w @ w.T + grid.rank_tensor(("host", "gpu"))
    ws = each(w, grid)
    for i, (point, wi) in enumerate(zip(grid._shape.points(), ws)):
        assert torch.allclose(fetch(r, **dict(point)), wi @ wi.T + i)
    assert isinstance(mk.inspect(r), torch.Tensor) and not isinstance(mk.inspect(r), mk.Tensor)
    assert torch.equal(mk.inspect(r), fetch(r, host=0, gpu=0))  # no coordinates: the first proc


def test_a_mesh_tensor_says_its_shape_dtype_device_and_mesh_without_fetching(grid):
    with grid.activate():
        t = torch.zeros(3, 5, dtype=torch.float64)
    text = repr(t)
    assert "shape=(3, 5)" in text and "float64" in text and "device=cpu" in text
    assert repr(grid.name) in text and "{host: 2, gpu: 2}" in text
    assert t.mesh is grid and t.shape == (3, 5) and t.dtype == torch.float64


def test_ops_on_a_mesh_tensor_outside_activate_run_on_its_mesh(grid):
    with grid.activate():
        t = torch.ones(2)
    u = (t * 3).sum()
    assert isinstance(u, mk.Tensor) and u.mesh is grid
    assert mk.inspect(u).item() == 6.0


def test_a_thousand_pipelined_ops_arrive_in_order(grid):
    with grid.activate():
        x = torch.zeros(3)
        for _ in range(1000):
            x = x + 1
        x.mul_(2)
    assert fetch(x, host=1, gpu=1).tolist() == [2000.0] * 3


def test_show_groups_the_ranks_with_equal_values_and_with_coordinates_shows_one(grid, monkeypatch):
    shown: list[object] = []
    monkeypatch.setattr(ops, "_display", shown.append)  # (IPython's display where a shell runs)
    with grid.activate():
        t = torch.zeros(2) + grid.rank_tensor("host")
    mk.show(t)
    mk.show(t, host=1, gpu=0)
    text = repr(shown[0])
    assert "ranks 0-1: tensor([0., 0.])" in text and "ranks 2-3: tensor([1., 1.])" in text, text
    assert "<table>" in shown[0]._repr_html_()
    assert torch.equal(shown[1], torch.ones(2))


def test_fetch_shard_gives_a_future_of_the_whole_structure(grid):
    with grid.activate():
        a = torch.ones(2)
        b = torch.zeros(1)
    got = mk.fetch_shard({"a": a, "pair": (b, 7)}, {"host": 1}, gpu=1).get(timeout=TIMEOUT)
    assert got["a"].tolist() == [1.0, 1.0] and got["pair"][0].tolist() == [0.0] and got["pair"][1] == 7


def test_fetched_values_keep_dtype_shape_and_values_small_or_large_views_or_not(grid):
    with grid.activate():
        base = torch.arange(24.0).reshape(4, 6)
        kinds = {
            "bf16": base.to(torch.bfloat16),
            "bool": base > 10,
            "int8": base.to(torch.int8),
            "scalar": base.sum(),
            "empty": base[:0],
            "view": base.t()[1:3],  # strided, offset
            "large": torch.ones(512, 1024),  # 2 MiB: out of band
        }
    got = mk.fetch_shard(kinds, gpu=1).get(timeout=TIMEOUT)
    local = torch.arange(24.0).reshape(4, 6)
    assert got["bf16"].dtype == torch.bfloat16 and torch.equal(got["bf16"], local.to(torch.bfloat16))
    assert torch.equal(got["bool"], local > 10) and torch.equal(got["int8"], local.to(torch.int8))
    assert got["scalar"].shape == () and got["scalar"].item() == local.sum().item()
    assert got["empty"].shape == (0, 6)
    assert torch.equal(got["view"], local.t()[1:3])
    assert got["large"].shape == (512, 1024) and bool((got["large"] == 1).all())


# -- failures -------------------------------------------------------------------------------


def test_an_op_that_fails_on_the_procs_poisons_what_uses_it_and_the_mesh_goes_on(grid):
    with grid.activate():
        t = torch.rand(3, 4)
        big = torch.rand(4, 1024 * 1024 * 1024 * 1024 * 8)  # 2**45 floats: no proc can hold it
        v = (big.sum() + t).relu()
    with pytest.raises(mk.RemoteException) as info:
        mk.inspect(v)
    e = info.value
    assert e.op == "aten::rand" and e.rank == 0
    assert "allocate" in e.message and "Traceback" in e.remote_traceback
    assert grid.name in str(e)
    del big, v
    assert mk.inspect(t.sum()).item() > 0  # RECOVERED
    assert grid.status() == ["alive"] * 4


def test_an_error_torch_would_raise_is_raised_at_the_line_that_made_it(grid):
    with grid.activate():
        a = torch.rand(3, 4)
        with pytest.raises(RuntimeError, match="must have same reduction dim"):
            torch.mm(a, a)
        assert mk.inspect((a @ a.T).sum()) is not None  # the engine was not disturbed


def test_values_needed_in_the_controller_say_to_use_inspect(grid):
    with grid.activate():
        t = torch.ones(2)
    with pytest.raises(mk.MeshTensorError, match="inspect"):
        t.sum().item()
    with pytest.raises(mk.MeshTensorError, match="inspect"):
        if t.sum() > 0:
            pass
    for use in (t.tolist, t.numpy, lambda: __import__("pickle").dumps(t)):
        with pytest.raises(mk.MeshTensorError, match=f"on the procs of mesh {grid.name!r}"):
            use()


def test_a_tensor_of_another_mesh_is_refused_under_activate_and_to_mesh_is_named(grid):
    other = grid.slice(host=0)
    with grid.activate():
        t = torch.ones(2)
    with other.activate():
        with pytest.raises(mk.MeshTensorError, match="to_mesh"):
            t + 1


def test_a_collective_poisoned_on_one_rank_fails_on_every_rank_and_nothing_hangs(grid):
    @mk.remote(propagate=lambda x: x)
    def fail_on_rank_one(x):
        if mk.current_rank().rank == 1:
            raise ValueError("rank one refuses")
        return x

    with grid.activate():
        t = fail_on_rank_one(torch.ones(2))
        s = t.reduce(("host", "gpu"), "sum")
    with pytest.raises(mk.RemoteException, match="rank one refuses"):
        fetch(s, host=0, gpu=1)
    with pytest.raises(mk.RemoteException, match="another rank"):
        fetch(s, host=1, gpu=1)
    with grid.activate():
        ok = torch.ones(2).reduce(("host", "gpu"), "sum")
    assert fetch(ok, host=1, gpu=1).tolist() == [4.0, 4.0]


# -- collectives ----------------------------------------------------------------------------


def test_reduce_over_each_dimension_and_over_both(grid):
    with grid.activate():
        x = torch.ones(3) * (grid.rank_tensor(("host", "gpu")) + 1)  # 1, 2, 3, 4
        by_gpu = x.reduce("gpu", "sum")
        by_host = x.reduce("host", "max")
        both = x.reduce(("host", "gpu"), "avg")
        prod = x.reduce("gpu", "product")
        low = x.reduce("host", "min")
        stacked = x.reduce("gpu", "stack")
    assert [fetch(by_gpu, **dict(p))[0].item() for p in grid._shape.points()] == [3, 3, 7, 7]
    assert [fetch(by_host, **dict(p))[0].item() for p in grid._shape.points()] == [3, 4, 3, 4]
    assert fetch(both, host=1, gpu=0).tolist() == [2.5] * 3
    assert fetch(prod, host=1).tolist() == [12.0] * 3
    assert fetch(low, gpu=1).tolist() == [2.0] * 3
    assert fetch(stacked, host=1).tolist() == [[3.0] * 3, [4.0] * 3]


def test_scatter_reductions_split_the_first_dimension_across_the_procs(grid):
    with grid.activate():
        r = grid.rank_tensor("gpu")
        x = torch.arange(4.0).reshape(2, 2) + 10 * r  # rank g: [[10g, 10g+1], [10g+2, 10g+3]]
        rs = x.reduce("gpu", "sum", scatter=True)  # reduce-scatter
        a2a = x.reduce("gpu", "stack", scatter=True)  # all-to-all
    assert fetch(rs, gpu=0).tolist() == [10.0, 12.0] and fetch(rs, gpu=1).tolist() == [14.0, 16.0]
    assert fetch(a2a, gpu=1).tolist() == [[2.0, 3.0], [12.0, 13.0]]
    with grid.activate(), pytest.raises(ValueError, match="must start with 2"):
        torch.ones(3).reduce("gpu", "sum", scatter=True)


def test_reduce_in_place_and_the_module_level_names(grid):
    with grid.activate():
        x = torch.ones(2) + grid.rank_tensor("host")
        same = x.reduce_("host", "sum")
        y = torch.ones(2)
        tree = mk.reduce({"y": y}, "gpu", "sum")
        mk.reduce_([y], "gpu", "sum")
    assert same is x and fetch(x, host=0, gpu=1).tolist() == [3.0, 3.0]
    with grid.activate():
        ints = torch.ones(2, dtype=torch.int64) * (grid.rank_tensor(("host", "gpu")) + 1)  # 1..4
        mean = ints.reduce(("host", "gpu"), "avg")  # 10 // 4: integers keep their dtype
        ints.reduce_("gpu", "avg")  # (1+2)//2, (3+4)//2
    assert mean.dtype == torch.int64 and fetch(mean).tolist() == [2, 2]
    assert [fetch(ints, host=h).tolist()[0] for h in (0, 1)] == [1, 3]
    assert fetch(tree["y"]).tolist() == [2.0, 2.0] and fetch(y).tolist() == [2.0, 2.0]


def test_reduce_names_a_bad_dimension_or_reduction(grid):
    with grid.activate():
        x = torch.ones(2)
        with pytest.raises(DimensionError, match="'dp'"):
            x.reduce("dp")
        with pytest.raises(ValueError, match="reductions are"):
            x.reduce("gpu", "median")
        with pytest.raises(ValueError, match="several dimensions"):
            x.reduce(("host", "gpu"), "stack")


# -- meshes: views and movement -------------------------------------------------------------


def test_rename_split_flatten_and_to_table_keep_the_procs(grid):
    renamed = grid.rename(host="dp", gpu="tp")
    assert renamed.sizes == {"dp": 2, "tp": 2} and renamed._shape.ranks == grid._shape.ranks
    split = grid.split(host=("dp", "pp"), gpu=("tp",), pp=1)
    assert split.sizes == {"dp": 2, "pp": 1, "tp": 2}
    assert grid.flatten("all").sizes == {"all": 4}
    table = renamed.to_table()
    assert "dp \\ tp" in table and table.splitlines()[-1].split() == ["1", "2", "3"]
    with pytest.raises(DimensionError):
        grid.split(host=("a", "b"), a=3)
    with renamed.activate():
        s = (torch.ones(1) * renamed.rank_tensor("tp")).reduce("dp", "sum")
    assert fetch(s, dp=0, tp=1).tolist() == [2.0]


def test_to_mesh_moves_a_tensor_between_slices_as_a_pipeline_does(grid):
    stages = grid.rename(host="pp")
    first, second = stages.slice(pp=0), stages.slice(pp=1)
    with first.activate():
        x = torch.ones(2) * (grid.slice(host=0).rank_tensor("gpu") + 5)
    y = x.to_mesh(second)
    assert y.mesh is second
    with second.activate():
        z = y * 2
    assert fetch(z, gpu=0).tolist() == [10.0, 10.0] and fetch(z, gpu=1).tolist() == [12.0, 12.0]
    back = mk.to_mesh({"z": z}, first)["z"]
    assert fetch(back, gpu=1).tolist() == [12.0, 12.0]


def test_to_mesh_copies_into_dimensions_the_source_lacks_and_checks_sizes(grid):
    with grid.activate():
        x = torch.ones(1) * grid.rank_tensor(("host", "gpu"))
    one_host = x.slice_mesh(host=1)  # ranks 2 and 3, by gpu
    everywhere = one_host.to_mesh(grid)
    assert [fetch(everywhere, **dict(p)).item() for p in grid._shape.points()] == [2.0, 3.0, 2.0, 3.0]
    (first_host,) = mk.slice_mesh([x], host=0)
    moved = first_host.to_mesh(grid.slice(host=1))
    assert [fetch(moved, gpu=g).item() for g in (0, 1)] == [0.0, 1.0]
    with pytest.raises(ValueError, match="dimension"):
        x.to_mesh(grid.flatten("all"))


# -- remote functions ----------------------------------------------------------------------


def _plus_rank(x: torch.Tensor) -> torch.Tensor:
    return x + mk.current_rank().rank


def test_remote_runs_a_function_on_the_procs_with_each_propagation(grid):
    double = mk.remote(lambda x: x * 2, propagate=lambda x: x)
    calls: list[int] = []

    @mk.remote
    def summary(x):
        calls.append(1)
        return {"total": x.sum(), "n": x.numel(), "parts": [x[:1], x[1:]]}

    with grid.activate():
        a = torch.ones(3)
        d = double(a)
        s1 = summary(a)
        s2 = summary(a + 1)  # same argument kinds: no round trip, same structure
        nothing = mk.remote(_plus_rank, propagate="inspect")(a)
        by_name = mk.remote("torch.neg", propagate=lambda x: x)(a)
    assert nothing is None
    assert fetch(d, host=1).tolist() == [2.0] * 3
    assert isinstance(s1["total"], mk.Tensor) and s1["n"] == 3 and len(s1["parts"]) == 2
    assert fetch(s2["total"], gpu=1).item() == 6.0 and fetch(s1["parts"][1]).tolist() == [1.0, 1.0]
    assert fetch(by_name).tolist() == [-1.0] * 3
    plus = mk.remote(_plus_rank, propagate=lambda x: x)
    with grid.activate():
        p = plus(torch.zeros(1))
    assert [fetch(p, **dict(q)).item() for q in grid._shape.points()] == [0.0, 1.0, 2.0, 3.0]


# -- autograd and training -----------------------------------------------------------------


def test_backward_runs_on_the_procs_and_the_gradient_is_a_mesh_tensor(grid):
    with grid.activate():
        w = torch.ones(3, requires_grad=True)
        loss = (w * (grid.rank_tensor("gpu") + 2)).pow(2).sum()
    loss.backward()
    assert isinstance(w.grad, mk.Tensor) and w.grad.mesh is grid
    assert fetch(w.grad, gpu=0).tolist() == [8.0] * 3 and fetch(w.grad, gpu=1).tolist() == [18.0] * 3


def test_a_module_built_under_activate_trains_data_parallel_like_one_device(grid):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    xs = [torch.randn(5, 4) for _ in range(4)]
    ys = [torch.randn(5, 1) for _ in range(4)]
    dp = grid.flatten("dp")
    with dp.activate():
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        assert all(isinstance(p, mk.Tensor) and isinstance(p, nn.Parameter) for p in model.parameters())
        with torch.no_grad():
            for p, q in zip(model.parameters(), ref.parameters()):
                p.copy_(q.detach())
        rank = dp.rank_tensor("dp").reshape(1)
        x = torch.stack(xs).index_select(0, rank)[0]  # each proc its own batch
        y = torch.stack(ys).index_select(0, rank)[0]
        for _ in range(3):
            loss = nn.functional.mse_loss(model(x), y)
            params = list(reversed(list(model.parameters())))
            with torch.no_grad():
                for p, g in zip(params, mk.grad_generator(loss, params)):
                    g.reduce_("dp", "avg")
                    p -= 0.1 * g
    for _ in range(3):  # the same on one device: the mean of the four batches' gradients
        grads = [
            torch.autograd.grad(nn.functional.mse_loss(ref(xi), yi), list(ref.parameters()))
            for xi, yi in zip(xs, ys)
        ]
        with torch.no_grad():
            for i, p in enumerate(ref.parameters()):
                p -= 0.1 * sum(g[i] for g in grads) / 4
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(fetch(p, dp=0), q, atol=1e-5) and torch.allclose(fetch(p, dp=3), q, atol=1e-5)


def test_a_deep_copy_of_a_module_on_the_mesh_is_a_copy_on_the_procs(grid):
    import copy

    with grid.activate():
        model = nn.Linear(3, 2)
    twin = copy.deepcopy(model)
    assert isinstance(twin.weight, mk.Tensor) and isinstance(twin.weight, nn.Parameter)
    assert twin.weight.requires_grad and twin.weight._ref != model.weight._ref
    assert torch.equal(fetch(twin.weight, gpu=1), fetch(model.weight, gpu=1))
    with torch.no_grad():
        twin.weight.zero_()
    assert not bool((fetch(model.weight) == 0).all())


def test_streams_and_borrows_order_the_work_as_written(grid):
    comms = mk.Stream("comms")
    assert mk.get_active_stream().name == "main"
    with grid.activate():
        g = torch.ones(2) * (grid.rank_tensor("gpu") + 1)
        borrowed, borrow = comms.borrow(g, mutable=True)
        with comms.activate():
            assert mk.get_active_stream() is comms
            borrowed.reduce_("gpu", "sum")
        borrow.drop()
        after = g * 10
    assert fetch(after, gpu=0).tolist() == [30.0, 30.0]


def test_coalescing_and_no_mesh(grid):
    with pytest.raises(ValueError, match="no device mesh is active"):
        mk.get_active_mesh()
    with grid.activate():
        assert mk.get_active_mesh() is grid
        with mk.coalescing():
            t = torch.ones(2) + 1
        with mk.no_mesh.activate():
            local = torch.ones(2) + 1
        assert not isinstance(local, mk.Tensor)
    assert fetch(t).tolist() == local.tolist()


# -- memory and deaths --------------------------------------------------------------------


def test_dropping_a_mesh_tensor_frees_the_procs_memory(grid):
    mk.inspect(grid.rank_tensor("gpu"))  # the engine runs; earlier tests' garbage is freed
    before = memory(grid)
    with grid.activate():
        big = torch.zeros(1024, 1024)  # 4 MiB on each proc
    mk.inspect(big.sum())
    held = memory(grid)
    assert all(held[r]["bytes"] >= before[r]["bytes"] + 4 * 1024 * 1024 for r in held)
    del big
    after = memory(grid)
    assert all(after[r]["bytes"] <= held[r]["bytes"] - 4 * 1024 * 1024 for r in after)


def test_each_procs_tensor_memory_is_in_the_picture_the_inspector_and_panel_read(grid):
    from proc_helpers import wait_for

    from monarch_kernel import controller

    with grid.activate():
        held = torch.zeros(256, 1024)  # 1 MiB on each proc
    mk.inspect(held[:1])

    def usage() -> list[dict[str, int]]:
        view = controller.view_of(grid.name)
        return [r["usage"] for r in view["ranks"]] if view else []

    def holding() -> list[dict[str, int]]:
        got = [u for u in usage() if u and u.get("tensors", 0) >= 1 << 20]
        return got if len(got) == 4 else []

    got = wait_for(holding)
    assert len(got) == 4, usage()
    assert all(u["tensor_refs"] >= 1 for u in got)


def test_a_loop_of_new_reduce_results_reuses_their_memory_and_keeps_none_for_long(grid):
    mib = 1 << 20
    with grid.activate():
        x = torch.ones(mib)  # 4 MiB on each proc
    mk.inspect(x[:1])
    base = memory(grid)
    for i in range(4):
        with grid.activate():
            r = (x * (i + 1)).reduce("gpu", "sum")  # the last result, dropped, makes the next
        assert fetch(r[:2], host=1, gpu=0).tolist() == [2.0 * (i + 1)] * 2
    held = memory(grid)
    # r, the spare kept for the next reduce, and the x * i of the batch in flight at most
    assert all(held[p]["bytes"] <= base[p]["bytes"] + 3 * 4 * mib for p in held), (base, held)
    del r
    mk.inspect(x[:1])  # a batch with no collective: the spare goes after it
    mk.inspect(x[1:2])
    after = memory(grid)
    assert all(after[p]["bytes"] <= base[p]["bytes"] for p in after), (base, after)


@pytest.mark.slow
def test_a_dead_proc_fails_the_tensors_made_before_and_new_ones_work_after_respawn(state_home):
    import os
    import signal

    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        with procs.activate():
            t = torch.ones(2)
        assert mk.inspect(t).tolist() == [1.0, 1.0]
        pid = procs._session("t").client.worker(1)["pid"]
        os.kill(pid, signal.SIGKILL)
        from proc_helpers import wait_for

        assert wait_for(lambda: procs.status()[1] == "dead")
        with pytest.raises(SupervisionError, match="rank 1"):
            mk.inspect(t)
        with pytest.raises(SupervisionError):
            mk.inspect(t, procs=0)  # every tensor of the mesh made before the death
        procs.respawn()
        with procs.activate():
            u = torch.ones(2) * 3
            s = u.reduce("procs", "sum")
        assert fetch(s, procs=1).tolist() == [6.0, 6.0]
    finally:
        procs.stop()


# -- GPUs ---------------------------------------------------------------------------------


class _Backend(mk.Actor):
    @mk.endpoint
    def backend(self) -> str:
        import torch.distributed as dist

        return str(dist.get_backend())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_gpus_ops_run_on_cuda_reduce_uses_nccl_and_values_come_back_on_the_cpu(state_home):
    n = min(2, torch.cuda.device_count())
    procs = this_host().spawn_procs(per_host={"gpus": n})
    try:
        with procs.activate():
            t = torch.ones(1024, device="cuda") * (procs.rank_tensor("gpus") + 1)
            s = t.reduce("gpus", "sum")
            g = t.reduce("gpus", "stack")
        assert t.device.type == "cuda" and "device=cuda" in repr(t)
        got = fetch(s, gpus=n - 1)
        assert got.device.type == "cpu" and bool((got == n * (n + 1) / 2).all())
        assert fetch(g).shape == (n, 1024)
        assert set(procs.spawn("backend", _Backend).backend.call().get().values()) == {"nccl"}
    finally:
        procs.stop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_gpus_a_reduce_on_a_comms_stream_with_borrows_computes_what_one_stream_does(state_home):
    n = min(2, torch.cuda.device_count())
    procs = this_host().spawn_procs(per_host={"gpus": n})
    comms = mk.Stream("comms")
    try:
        with procs.activate():
            grads = [
                torch.full((1 << 20,), float(i), device="cuda") * (procs.rank_tensor("gpus") + 1)
                for i in range(4)
            ]
            params = [torch.zeros(1 << 20, device="cuda") for _ in range(4)]
            for p, g in zip(params, grads):
                borrowed, borrow = comms.borrow(g, mutable=True)
                with comms.activate():
                    borrowed.reduce_("gpus", "sum")
                borrow.drop()
                p += g  # on the main stream, after the drop: sees the reduced values
        total = n * (n + 1) / 2
        for i, p in enumerate(params):
            assert bool((fetch(p) == i * total).all())
    finally:
        procs.stop()
