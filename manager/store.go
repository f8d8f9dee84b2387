package manager

// StoreLayout is an adapter that names its store's dirs, so a power cut can
// put them on lazy filesystems (issue 32 item 2): the manager-verb
// power-cut cases are generated only for an adapter that implements it.
type StoreLayout interface {
	// StoreDirs are the store's durable dirs, where a power cut keeps only
	// what was made durable (records, images, the guests' disks), and its
	// volatile ones, which a reboot empties (the run dir: sockets, pid
	// files; /run is a tmpfs on a real node). Setup creates them inside
	// the lazy mounts.
	StoreDirs() (durable, volatile []string)
}
