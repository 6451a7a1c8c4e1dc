"""What the user asked for, and whether it can run: the inventory, the experiment catalog, the sweep, the
validity rules and the plan that joins them, a point's share of a node, its predicted memory and FLOPs,
its references, and what a trainer environment holds. Reads files; asks no scheduler, writes nothing.
"""
