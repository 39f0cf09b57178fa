"""Running a spec's cases on the nodes: connections and the one fan-out to every node (`fleet`),
the library and apps put there (`deploy`), the command of each kind of case (`commands`, `srun`
under Slurm), what runs beside a case (`beside`), waits that follow a node's progress
(`watched`), what the nodes and their RDMA counters say (`about`, `counters`), what a run
records of each case (`records`: the lines of records.jsonl and load.jsonl), what a failed case
left of the data path (`datapath`), the elastic and DDP scenarios (`elastic_scenario`,
`ddp_scenario`) and the lines they write (`scenario_records`: elastic.jsonl, ddp.jsonl), what is
said while it runs (`caselog`, `progress`), the loop itself (`runner`), and a task's expected
failures in one line (`task_errors`)."""
