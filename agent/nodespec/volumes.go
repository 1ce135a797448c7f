package nodespec

// Volume is one sandbox volume kept on the node (the `volumes` concern): a
// disk of SizeGiB that outlives the instances mounting it. The agent keeps
// one for each volume listed, grows it when SizeGiB grows, and removes one
// that left the list once no instance mounts it.
type Volume struct {
	// ID is the volume's id (vol_…); the agent names its image after it.
	ID      string `json:"id"`
	SizeGiB int    `json:"sizeGiB"`
}

// Mount is a volume an instance mounts: the volume (listed in the spec's
// Volumes), where in the instance, and whether read-only.
type Mount struct {
	VolumeID string `json:"volumeId"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}
