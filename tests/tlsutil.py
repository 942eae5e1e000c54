"""TLS for the tests: certificates made by the tests themselves with the ``openssl`` command (no
secret is committed), and a real TLS terminator (Debian's ``stunnel4``) in front of a broker, as
deployments put one in front of bmqbrkr today.

:func:`make_certificates` writes, into a directory of the test run's:

* ``ca.pem``: the CA every good certificate chains to; ``other-ca.pem``: an unrelated one;
* ``server.pem`` + ``server.key``: for ``localhost`` and ``127.0.0.1``;
* ``wrong-host.pem`` + key: for ``broker.invalid`` only; ``expired.pem`` + key: expired;
* ``client.pem`` + ``client.key``: a client certificate from ``ca.pem``; ``stranger.pem`` + key:
  one from ``other-ca.pem`` (a terminator that requires client certificates refuses it).
"""
from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from typing import Dict, List, Optional

from realbroker import free_port, wait_listening

START_TIMEOUT = 20.0


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


def stunnel_binary() -> Optional[str]:
    return shutil.which("stunnel4") or shutil.which("stunnel")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   timeout=60)


def _key_and_request(name: str, subject: str, cwd: Path) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=cwd)


def _sign(name: str, ca: str, extensions: str, cwd: Path) -> None:
    (cwd / f"{name}.ext").write_text(extensions + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "30", "-extfile", f"{name}.ext", cwd=cwd)


# `openssl ca`'s configuration for the expired certificate: a throwaway database in the directory.
_EXPIRED_CA_CONFIG = """\
[ca]
default_ca = expired
[expired]
database = expired-index.txt
serial = expired-serial.txt
new_certs_dir = .
default_md = sha256
policy = anything
unique_subject = no
[anything]
commonName = supplied
"""


def _sign_expired(name: str, ca: str, extensions: str, cwd: Path) -> None:
    """A certificate whose validity ended in 2020 (and began the day before). `openssl x509
    -days -1` made one until OpenSSL 3.4, which refuses a negative count, and its `-not_after`
    is not in the OpenSSL 3.0 of older systems; `openssl ca -startdate/-enddate` works on both."""
    (cwd / f"{name}.ext").write_text(extensions + "\n")
    (cwd / "expired-ca.cnf").write_text(_EXPIRED_CA_CONFIG)
    (cwd / "expired-index.txt").write_text("")
    (cwd / "expired-serial.txt").write_text("01\n")
    _openssl("ca", "-batch", "-notext", "-config", "expired-ca.cnf", "-cert", f"{ca}.pem", "-keyfile", f"{ca}.key",
             "-in", f"{name}.csr", "-out", f"{name}.pem", "-startdate", "20200101000000Z",
             "-enddate", "20200102000000Z", "-extfile", f"{name}.ext", cwd=cwd)


def make_certificates(directory: Path) -> Dict[str, Path]:
    """Write the files listed in the module docstring; return name -> path (``"server"`` is the
    certificate, ``"server.key"`` its key, and so on)."""
    directory.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                 f"{ca}.key", "-out", f"{ca}.pem", "-subj", f"/CN=bmq test {ca}", "-days", "30",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
                 cwd=directory)
    server = "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName="
    client = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth"
    made = [
        ("server", "/CN=localhost", "ca", server + "DNS:localhost,IP:127.0.0.1", _sign),
        ("wrong-host", "/CN=broker.invalid", "ca", server + "DNS:broker.invalid", _sign),
        ("expired", "/CN=localhost", "ca", server + "DNS:localhost,IP:127.0.0.1", _sign_expired),
        ("client", "/CN=bmq test client", "ca", client, _sign),
        ("stranger", "/CN=bmq test stranger", "other-ca", client, _sign),
    ]
    for name, subject, ca, extensions, sign in made:
        _key_and_request(name, subject, directory)
        sign(name, ca, extensions, directory)
    files = {}
    for name in ("ca", "other-ca", "server", "wrong-host", "expired", "client", "stranger"):
        files[name] = directory / f"{name}.pem"
        files[f"{name}.key"] = directory / f"{name}.key"
    return files


class Stunnel:
    """``stunnel4`` on a free 127.0.0.1 port terminating TLS in front of ``upstream``
    (``tcp://host:port``), with ``cert``/``key``; with ``client_ca`` it requires client
    certificates that chain to it. Started by :meth:`start`, stopped by :meth:`stop`."""

    def __init__(self, binary: str, directory: Path, upstream: str, cert: Path, key: Path,
                 client_ca: Optional[Path] = None) -> None:
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        host, port = upstream.split("://", 1)[-1].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self.process: Optional[subprocess.Popen] = None

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _config(self) -> str:
        lines: List[str] = [
            "foreground = yes",
            f"pid = {self.directory / 'stunnel.pid'}",
            "debug = warning",
            f"output = {self.directory / 'stunnel.log'}",
            "[bmq]",
            f"accept = 127.0.0.1:{self.port}",
            f"connect = {self.upstream[0]}:{self.upstream[1]}",
            f"cert = {self.cert}",
            f"key = {self.key}",
            "sslVersionMin = TLSv1.2",
            "socket = l:TCP_NODELAY=1",
            "socket = r:TCP_NODELAY=1",
        ]
        if self.client_ca is not None:
            lines += [f"CAfile = {self.client_ca}", "verifyChain = yes", "requireCert = yes"]
        return "\n".join(lines) + "\n"

    def start(self) -> "Stunnel":
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "stunnel.conf"
        config.write_text(self._config())
        self.process = subprocess.Popen([self.binary, str(config)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_listening(self.process, self.port, START_TIMEOUT, "stunnel", self.log_tail)
        except RuntimeError:
            self.stop()
            raise
        return self

    def log_tail(self, lines: int = 20) -> str:
        log = self.directory / "stunnel.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)

    def __enter__(self) -> "Stunnel":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
