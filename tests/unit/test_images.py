import hashlib
import http.server
import shutil
import threading

import pytest

from infra import images
from infra.config import Image
from infra.errors import LabError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RXELAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_recipe_key_is_stable_and_follows_every_recipe_file(tmp_path, monkeypatch):
    before = images.debian_recipe_key()
    assert images.debian_recipe_key() == before
    recipes = tmp_path / "recipes"
    shutil.copytree(images.RECIPES, recipes)
    monkeypatch.setattr(images, "RECIPES", recipes)
    assert images.debian_recipe_key() == before, "same files, same key"
    with (recipes / "debian-12" / "packages.txt").open("a") as f:
        f.write("htop\n")
    assert images.debian_recipe_key() != before
    assert "htop" in images.debian_packages()


def test_packages_list_has_what_the_lab_needs():
    pkgs = images.debian_packages()
    for p in ("rdma-core", "python3-pyverbs", "perftest", "openmpi-bin", "cloud-init"):
        assert p in pkgs


def test_auto_prefers_a_cached_ubuntu_image_and_never_downloads(cache):
    kind, why = images.resolve(Image.AUTO)
    assert kind is Image.DEBIAN and "IMAGE=ubuntu-24.04" in why
    d = cache / "images" / "ubuntu-24.04-0123456789abcdef"
    d.mkdir(parents=True)
    (d / images.UBUNTU_FILE).write_bytes(b"disk")
    (d / "image.json").write_text(images.BaseImage(Image.UBUNTU, d / images.UBUNTU_FILE, "qcow2").to_json())
    kind, why = images.resolve(Image.AUTO)
    assert kind is Image.UBUNTU and "in the cache" in why
    assert images.resolve(Image.DEBIAN)[0] is Image.DEBIAN


def test_sha256sums_parsing():
    digest = "a" * 64
    text = f"{'b' * 64} *other.img\n{digest} *{images.UBUNTU_FILE}\n"
    assert images.parse_sha256sums(text, images.UBUNTU_FILE) == digest
    with pytest.raises(LabError, match="no entry"):
        images.parse_sha256sums("", images.UBUNTU_FILE)
    with pytest.raises(LabError, match="malformed"):
        images.parse_sha256sums(f"xyz *{images.UBUNTU_FILE}", images.UBUNTU_FILE)


@pytest.fixture
def image_server(tmp_path):
    """Serves a fake cloud image and its SHA256SUMS from 127.0.0.1 only."""
    root = tmp_path / "www"
    root.mkdir()
    payload = b"not really a disk image\n" * 50000
    (root / images.UBUNTU_FILE).write_bytes(payload)

    def sums(digest):
        (root / "SHA256SUMS").write_text(f"{digest} *{images.UBUNTU_FILE}\n")

    sums(hashlib.sha256(payload).hexdigest())
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(root))  # noqa: E731
    http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", payload, sums
    finally:
        server.shutdown()
        server.server_close()


def test_ubuntu_download_is_verified_and_cached(cache, image_server, capsys):
    url, payload, _ = image_server
    image = images.ensure_ubuntu(url)
    assert image.kind is Image.UBUNTU and image.disk_format == "qcow2"
    assert image.disk.read_bytes() == payload
    assert "downloading" in capsys.readouterr().out
    assert images.ensure_ubuntu("http://127.0.0.1:9/") == image, "second call uses the cache"
    assert images.cached_ubuntu() == image


def test_ubuntu_checksum_mismatch_discards_the_download(cache, image_server):
    url, _, sums = image_server
    sums("0" * 64)
    with pytest.raises(LabError, match="checksum mismatch"):
        images.ensure_ubuntu(url)
    assert images.cached_ubuntu() is None
    assert not list((cache / "images").glob("*")), "nothing half-made is left in the cache"


def test_unreachable_image_server_is_a_clear_error(cache):
    with pytest.raises(LabError, match="cannot fetch") as e:
        images.ensure_ubuntu("http://127.0.0.1:9/")
    assert "IMAGE=debian-12" in e.value.hint
