terraform {
  required_version = ">= 1.4"

  # Only the built-in terraform_data resource is used, so `terraform init` needs no registry.
  # The state lives in the lab's state directory (see infra/terraform.py).
  backend "local" {}
}
