"""What sbench knows and measures of a cluster, apart from any campaign: the inventory discovered from the
scheduler (``discover``), each host probed against it (``probe``), the network (``fabric``), each device
measured and ranked, and the gate ``submit --preflight`` puts before a campaign (``preflight``), what the
scheduler says of a partition's nodes (``fit``), and the injected faults checked against the inventory
(``faultcheck``)."""
