output "inventory" {
  description = "The lab's inventory (name, SSH endpoint, data IP, RDMA device per node): what Fabric and the tests read."
  # ready.output is unknown until ready is created, so the file is read after the wait wrote it.
  value = jsondecode(file(terraform_data.ready.output))
}

output "inventory_file" {
  description = "Where the inventory is written."
  value       = terraform_data.ready.output
}
