# The lab's lifecycle. Each resource is one step of the infra package, run as a command;
# destroy-time provisioners undo them. Everything a step needs is in the resource's input,
# because destroy-time provisioners may only refer to self.

locals {
  repo      = abspath("${path.module}/..")
  state_dir = var.state_dir != "" ? var.state_dir : "${local.repo}/.lab"
  infra     = "${var.python} -m infra --state-dir '${local.state_dir}'"
  config = {
    nodes         = var.nodes
    image         = var.image
    extras        = var.extras
    accel         = var.accel
    mem_mb        = var.mem_mb
    data_net      = var.data_net
    mtu           = var.mtu
    lab           = var.lab
    ssh_port_base = var.ssh_port_base
  }
}

# Validate, resolve IMAGE=auto, record the configuration, make keys and cloud-init seeds.
resource "terraform_data" "lab" {
  triggers_replace = local.config
  input            = { infra = local.infra, repo = local.repo }

  provisioner "local-exec" {
    working_dir = self.input.repo
    command = join(" ", [
      self.input.infra, "configure",
      "--nodes", var.nodes, "--image", var.image, "--extras", var.extras, "--accel", var.accel,
      "--mem-mb", var.mem_mb, "--data-net", var.data_net, "--mtu", var.mtu, "--lab", var.lab,
      "--ssh-port-base", var.ssh_port_base,
    ])
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
  count            = var.nodes
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
  input            = "${local.state_dir}/inventory.json"

  provisioner "local-exec" {
    working_dir = local.repo
    command     = "${local.infra} wait"
  }
}
