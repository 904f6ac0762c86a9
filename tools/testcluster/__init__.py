"""A small cluster on this one machine, for multi-host tests: hosts h1..hN and a
"login" host, each in a network namespace of its own; each host runs its own sshd and
slurmd, the login host runs munged and slurmctld, and the tests' clients.

    python -m tools.testcluster up [--hosts N] [--no-slurm] [--no-ssh] [--name NAME]
    python -m tools.testcluster run [--name NAME] -- srun -N2 hostname
    python -m tools.testcluster down [NAME ... | --all]
    python -m tools.testcluster status

(from the repository's root), or in Python::

    from tools.testcluster import Cluster

    with Cluster.up(hosts=2) as c:
        c.run_in_login(["srun", "-N2", "hostname"])

Traffic goes only to loopback or to addresses inside the namespaces made here
(``_netns``). Everything a cluster makes (namespaces, folders) is written to
REGISTRY/NAME.json before it is made, and every process of a cluster runs in one of
its namespaces, so ``down`` (also of a cluster whose creator crashed) kills whatever
runs there and removes the rest (``_registry``). Needs root, iproute2,
openssh-server, munge and SLURM (`make .venv/.stamps/cluster`). More in
docs/testing-multihost.md.

The parts: ``_cluster`` (``Cluster``: making, using and removing one), ``_netns``
(namespaces, the network, processes in them), ``_ssh`` (sshd), ``_slurm`` (munged,
slurmctld, slurmd), ``_daemons`` (the daemons a creator started), ``_registry`` (the
records), ``_programs`` (the programs they run), ``__main__`` (the command line).
"""

from tools.testcluster._cluster import Cluster
from tools.testcluster._netns import Host
from tools.testcluster._programs import ClusterError, unavailable
from tools.testcluster._registry import REGISTRY

__all__ = ["REGISTRY", "Cluster", "ClusterError", "Host", "unavailable"]
