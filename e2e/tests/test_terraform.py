"""The Terraform modules, checked as far as an offline machine allows: formatting, tflint with its
bundled Terraform ruleset, and checkov's static checks (no downloads). `terraform init` and
`validate` need the aws and helm providers, which cannot be downloaded here; docs/deploy-terraform.md
says so."""

import shutil
import subprocess
from pathlib import Path

from conftest import ROOT

TERRAFORM = ROOT / "terraform"
DIRS = sorted(p.parent for p in TERRAFORM.glob("*/*/main.tf"))


def run(*args, cwd=TERRAFORM):
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=300)


def tool(name):
    candidates = (Path.home() / "go" / "bin" / name,
                  Path.home() / ".local" / "share" / "larder-e2e" / name / "bin" / name)
    found = next((str(p) for p in candidates if p.exists()), None) or shutil.which(name)
    assert found, f"{name} is installed by e2e/setup.sh"
    return found


def test_modules_and_examples_exist():
    names = {str(d.relative_to(TERRAFORM)) for d in DIRS}
    assert names == {"modules/larder-eks", "modules/larder-ec2", "modules/larder-s3-policy", "examples/eks",
                     "examples/ec2"}, names


def test_terraform_fmt():
    out = run(tool("terraform"), "fmt", "-check", "-recursive", "-diff")
    assert out.returncode == 0, out.stdout + out.stderr


def test_tflint():
    for d in DIRS:
        out = run(tool("tflint"), "--chdir", str(d), "--format", "compact")
        assert out.returncode == 0, f"{d}:\n{out.stdout}{out.stderr}"


def test_checkov():
    out = run(tool("checkov"), "-d", ".", "--skip-download", "--quiet", "--compact", "--framework", "terraform")
    assert out.returncode == 0 and "Failed checks: 0" in out.stdout, out.stdout + out.stderr
