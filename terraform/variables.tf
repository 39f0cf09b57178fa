# All Terraform is given (infra/terraform.py writes them): the lab's settings are not among
# them. They are declared, defaulted and checked in infra/lab_settings.py, and `make provision`
# writes the lab's config to its state directory, where every step reads it.

variable "state_dir" {
  description = "The lab's state directory (absolute): its config (request.json), keys, disks and logs."
  type        = string
}

variable "config_digest" {
  description = "SHA-256 of the lab's config file: when it changes, the lab is replaced. Empty in the var file of a lab made before it existed (destroy still works)."
  type        = string
  default     = ""
}

variable "python" {
  description = "The Python interpreter that runs the infra package."
  type        = string
  default     = "python3"
}
