# The lab's lifecycle. Each resource is one step of the infra package, run as a command;
# destroy-time provisioners undo them. Everything a step needs is in the resource's input,
# because destroy-time provisioners may only refer to self.
#
# The lab's config is not handed over here: `make provision` wrote it to the state directory
# (infra/state.py, request_file) and the steps read it there. Terraform reads only the number
# of nodes from it, and replaces the lab when the config's digest changes.

locals {
  repo        = abspath("${path.module}/..")
  infra       = "${var.python} -m infra --state-dir '${var.state_dir}'"
  config_file = "${var.state_dir}/request.json"
  # No config file: only a destroy of a lab whose file is gone (or that was made before it
  # existed) gets this far - configure refuses to run without it.
  nodes = fileexists(local.config_file) ? jsondecode(file(local.config_file)).nodes : 0
}

# Validate, resolve IMAGE=auto, record the configuration, make keys and cloud-init seeds.
resource "terraform_data" "lab" {
  triggers_replace = var.config_digest
  input            = { infra = local.infra, repo = local.repo }

  provisioner "local-exec" {
    working_dir = self.input.repo
    command     = "${self.input.infra} configure"
  }
}

# Build (Debian) or download (Ubuntu) the base image, or find it cached; pick the accelerator.
resource "terraform_data" "image" {
  triggers_replace = terraform_data.lab.id
  input            = terraform_data.lab.input

  provisioner "local-exec" {
    working_dir = self.input.repo
    command     = "${self.input.infra} image"
  }
}

# The isolated data segment.
resource "terraform_data" "network" {
  triggers_replace = terraform_data.lab.id
  input            = terraform_data.lab.input

  provisioner "local-exec" {
    working_dir = self.input.repo
    command     = "${self.input.infra} network up"
  }

  provisioner "local-exec" {
    when        = destroy
    on_failure  = continue
    working_dir = self.input.repo
    command     = "${self.input.infra} network down"
  }
}

resource "terraform_data" "node" {
  count            = local.nodes
  depends_on       = [terraform_data.image]
  triggers_replace = terraform_data.network.id
  input            = merge(terraform_data.lab.input, { index = count.index + 1 })

  provisioner "local-exec" {
    working_dir = self.input.repo
    command     = "${self.input.infra} node up ${self.input.index}"
  }

  provisioner "local-exec" {
    when        = destroy
    on_failure  = continue
    working_dir = self.input.repo
    command     = "${self.input.infra} node down ${self.input.index}"
  }
}

# Wait until every node answers SSH, cloud-init is done and rxe is ACTIVE; write the inventory.
resource "terraform_data" "ready" {
  triggers_replace = terraform_data.node[*].id
  input            = "${var.state_dir}/inventory.json"

  provisioner "local-exec" {
    working_dir = local.repo
    command     = "${local.infra} wait"
  }
}
