"""A fleet: several forkd hosts behind one gateway, membership and leases in etcd."""
