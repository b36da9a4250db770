"""A single-node Slurm cluster for the tests: Debian's slurmctld, slurmd and munged started by hand.

Needs root and the packages ``slurmctld slurmd munge slurm-client`` (`.ci/run` installs them). No systemd:
the three daemons run in the foreground as children of the test and are stopped by pid. Their state,
spool, logs, munge key and socket live in a fresh folder under /tmp (short: a unix socket path is limited
to 108 bytes).

The configuration goes to /etc/slurm/slurm.conf (a file already there is kept aside and put back): the
job steps that ``srun`` starts inside a batch job run without the SLURM_* variables of the job, so a
``SLURM_CONF`` would not reach them. Accounting storage is off, so ``sacct`` cannot report jobs; the
workflow's status checks use ``squeue`` instead, and ``MinJobAge`` keeps finished jobs visible to it for
10 minutes. One test cluster at a time per machine: a lock file serialises them.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SLURM_CONF = Path("/etc/slurm/slurm.conf")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol", "srun")
LOCK = Path(tempfile.gettempdir()) / "ggufpipe-slurm-test.lock"


def unavailable() -> str | None:
    """Why this machine cannot start the cluster, or None when it can."""
    if os.geteuid() != 0:
        return "the Slurm test starts slurmctld/slurmd/munged itself and needs root (CI runs it as root)"
    missing = [t for t in DAEMONS + CLIENTS if not shutil.which(t) and not Path("/usr/sbin", t).exists()]
    if missing:
        return ("Debian packages slurmctld slurmd munge slurm-client are not installed (missing "
                + ", ".join(missing) + "); .ci/run installs them")
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _mem_total_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("/proc/meminfo: no MemTotal line")


class SlurmCluster:
    """``with SlurmCluster(cpus=2) as c:`` starts munged, slurmctld and slurmd and waits for the node to
    be idle; leaving the block stops them (by pid) and restores /etc/slurm/slurm.conf."""

    def __init__(self, cpus: int = 2, min_job_age: int = 600):
        self.cpus = cpus
        self.min_job_age = min_job_age
        self.host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
        self.root: Path | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self._backup: Path | None = None
        self._wrote_conf = False
        self._lock = None

    # paths under the cluster's folder
    def path(self, *parts: str) -> Path:
        assert self.root is not None
        return self.root.joinpath(*parts)

    @property
    def ctld_log(self) -> Path:
        return self.path("slurmctld.log")

    def conf_text(self) -> str:
        memory = int(_mem_total_mb() * 0.9)
        return "\n".join([
            "ClusterName=ggufpipe-test",
            f"SlurmctldHost={self.host}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.path('munge.socket')}",
            f"StateSaveLocation={self.path('state')}",
            f"SlurmdSpoolDir={self.path('spool')}",
            f"SlurmctldPidFile={self.path('slurmctld.pid')}",
            f"SlurmdPidFile={self.path('slurmd.pid')}",
            f"SlurmctldLogFile={self.ctld_log}",
            f"SlurmdLogFile={self.path('slurmd.log')}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            # jobs stay visible to squeue (the workflow's status command) this long after they end
            f"MinJobAge={self.min_job_age}",
            # the node is what this file says even where the machine has fewer CPUs
            "SlurmdParameters=config_overrides",
            f"NodeName={self.host} CPUs={self.cpus} RealMemory={memory} State=UNKNOWN",
            f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

    def __enter__(self) -> SlurmCluster:
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        self._lock = open(LOCK, "w")  # noqa: SIM115 - held until __exit__
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ggufpipe-slurm-"))
        self.root.chmod(0o700)
        for d in ("state", "spool"):
            self.path(d).mkdir()
        key = self.path("munge.key")
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)

        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        if SLURM_CONF.exists():
            self._backup = self.path("slurm.conf.orig")
            shutil.copy2(SLURM_CONF, self._backup)
        tmp = SLURM_CONF.with_name(".slurm.conf.ggufpipe-test")
        tmp.write_text(self.conf_text())
        os.replace(tmp, SLURM_CONF)
        self._wrote_conf = True

        self._spawn("munged", [_exe("munged"), "-F", "-f", f"--key-file={key}",
                               f"--socket={self.path('munge.socket')}", f"--pid-file={self.path('munged.pid')}",
                               f"--log-file={self.path('munged.log')}", f"--seed-file={self.path('munged.seed')}"])
        self._wait(lambda: self.path("munge.socket").exists(), "munged socket", 20)
        self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-i", "-f", str(SLURM_CONF)])
        self._wait(lambda: self._run("scontrol", "ping").returncode == 0, "slurmctld (scontrol ping)", 60)
        self._spawn("slurmd", [_exe("slurmd"), "-D", "-f", str(SLURM_CONF)])
        self._wait(self.node_idle, f"node {self.host} idle in sinfo", 60)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = open(self.path(f"{name}.out"), "wb")  # noqa: SIM115 - the daemon's stdout, closed with it
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run([_exe(cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=30)

    def node_state(self) -> str:
        return self._run("sinfo", "-h", "-N", "-n", self.host, "-o", "%T").stdout.strip()

    def squeue_all(self) -> list[str]:
        """``<jobid> <state>`` of every job slurmctld still holds (finished ones for MinJobAge)."""
        return self._run("squeue", "-h", "-t", "all", "-o", "%i %T").stdout.splitlines()

    def node_idle(self) -> bool:
        return self.node_state() == "idle"

    def _wait(self, ready, what: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}:\n"
                                       + self.logs_tail())
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n" + self.logs_tail())

    def logs_tail(self, n: int = 3000) -> str:
        if self.root is None:
            return ""
        parts = []
        for f in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-n:]}")
        return "\n".join(parts)

    def __exit__(self, *exc) -> None:
        # stop in reverse order of start, each by its pid
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        if self._wrote_conf:
            if self._backup is not None:
                shutil.copy2(self._backup, SLURM_CONF)
            else:
                SLURM_CONF.unlink(missing_ok=True)
            self._wrote_conf = False
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def cleanup(self) -> None:
        """Remove the cluster's folder (after __exit__; kept until then for the logs)."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
