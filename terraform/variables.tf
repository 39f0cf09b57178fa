variable "nodes" {
  description = "Number of VMs."
  type        = number
  default     = 3
  validation {
    condition     = var.nodes >= 2 && var.nodes <= 8 && floor(var.nodes) == var.nodes
    error_message = "The nodes variable must be a whole number from 2 to 8."
  }
}

variable "image" {
  description = "Base image: auto, ubuntu-24.04 or debian-12."
  type        = string
  default     = "auto"
  validation {
    condition     = contains(["auto", "ubuntu-24.04", "debian-12"], var.image)
    error_message = "The image variable must be auto, ubuntu-24.04 or debian-12."
  }
}

variable "extras" {
  description = "Packages baked into the image beside the base set: none or torch."
  type        = string
  default     = "none"
  validation {
    condition     = contains(["none", "torch"], var.extras)
    error_message = "The extras variable must be none or torch."
  }
}

variable "accel" {
  description = "Accelerator: auto (KVM only if it really boots the guest), kvm or tcg."
  type        = string
  default     = "auto"
  validation {
    condition     = contains(["auto", "kvm", "tcg"], var.accel)
    error_message = "The accel variable must be auto, kvm or tcg."
  }
}

variable "mem_mb" {
  description = "Guest memory per VM, MiB."
  type        = number
  default     = 1024
  validation {
    condition     = var.mem_mb >= 384 && var.mem_mb <= 16384
    error_message = "The mem_mb variable must be from 384 to 16384."
  }
}

variable "data_net" {
  description = "Data network: auto, bridge (root: bridge in a netns of the lab) or vde."
  type        = string
  default     = "auto"
  validation {
    condition     = contains(["auto", "bridge", "vde"], var.data_net)
    error_message = "The data_net variable must be auto, bridge or vde."
  }
}

variable "mtu" {
  description = "Data network MTU (rxe path MTU 4096 at 9000, 1024 at 1500; vde carries 1500 at most)."
  type        = number
  default     = 9000
  validation {
    condition     = var.mtu >= 1280 && var.mtu <= 9000 && floor(var.mtu) == var.mtu
    error_message = "The mtu variable must be a whole number from 1280 to 9000."
  }
}

variable "lab" {
  description = "Lab name: names the namespace, taps and MAC addresses, so labs do not clash."
  type        = string
  default     = "rxelab"
}

variable "ssh_port_base" {
  description = "Node i's SSH is forwarded from 127.0.0.1:(ssh_port_base + i)."
  type        = number
  default     = 2220
  validation {
    condition     = var.ssh_port_base >= 1024 && var.ssh_port_base <= 65527
    error_message = "The ssh_port_base variable must be from 1024 to 65527."
  }
}

variable "state_dir" {
  description = "The lab's state directory (absolute). Empty: .lab/ in the repository."
  type        = string
  default     = ""
}

variable "python" {
  description = "The Python interpreter that runs the infra package."
  type        = string
  default     = "python3"
}
