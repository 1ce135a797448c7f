package nodespec

// Instance is one VPS instance the node runs (the `runtime` concern): the
// control plane lists in the NodeSpec every instance placed on the node
// that is not deleted, and `bcd` converges its runtime on the list. An
// instance that leaves the list is removed (its container or VM stopped
// and deleted, its rootfs and network freed).
type Instance struct {
	// ID is the instance's id (inst_…); the runtime names its container
	// or VM after it, so a restarted agent finds it again.
	ID string `json:"id"`
	// Generation numbers this instance's desired state: it grows with every
	// change of Desired, the limits or the image. The agent reports the
	// generation it converged on in its InstanceStatus.
	Generation int64 `json:"generation"`
	// Runtime is "container" (runc), "gvisor" (runsc: a sandbox) or "vm"
	// (QEMU).
	Runtime string `json:"runtime"`
	// Desired is "running" or "stopped".
	Desired string `json:"desired"`
	// VCPU and MemoryMiB are the flavor's limits (cgroup CPU quota and
	// memory limit for a container, -smp and -m for a VM); DiskGiB the
	// size of the instance's disk (a VM's disk, a container's rootfs
	// quota where the runtime can apply one).
	VCPU      int   `json:"vcpu"`
	MemoryMiB int64 `json:"memoryMiB"`
	DiskGiB   int   `json:"diskGiB,omitempty"`
	// Image is what the instance boots: fetched by the agent from the API
	// (protocol.InstanceImagePath) and checked against SHA256.
	Image InstanceImage `json:"image"`
	// Devices are the stable device ids of the allocation's GPU atoms,
	// exposed to the instance through CDI as for hold reservations.
	Devices []string `json:"devices,omitempty"`
	// Command, when set, is what a container runs instead of the image's
	// /sbin/init.
	Command []string `json:"command,omitempty"`
	// UserData says the instance has user data: the agent fetches it
	// (protocol.InstanceUserDataPath) only when it hands it to the runtime,
	// so no secret is ever in the NodeSpec or on the agent's disk beyond
	// the instance's own seed.
	UserData bool `json:"userData,omitempty"`
	// Env says the instance has environment variables: the agent fetches
	// them (protocol.InstanceEnvPath), secrets resolved, when it creates
	// the container, as it fetches user data.
	Env bool `json:"env,omitempty"`
	// Restore, when set, makes a container or gvisor instance from a
	// sandbox snapshot (protocol.SandboxSnapshotPath) instead of Image:
	// its rootfs, and for a memory snapshot (gvisor only) its processes.
	Restore *InstanceRestore `json:"restore,omitempty"`
	// Snapshots are the snapshots the control plane wants taken of this
	// running container or gvisor instance: the agent checkpoints it
	// (leaving it running) and PUTs each to protocol.SandboxSnapshotPath
	// once; a snapshot leaves the list when the control plane has it.
	Snapshots []InstanceSnapshot `json:"snapshots,omitempty"`
	// Mounts are the sandbox volumes a container or gvisor instance
	// mounts (bind mounts of the node's volumes, read-only when asked).
	Mounts []Mount `json:"mounts,omitempty"`
}

// InstanceSnapshot asks for one snapshot of an instance.
type InstanceSnapshot struct {
	ID string `json:"id"`
	// Memory asks for the processes too (a gVisor checkpoint).
	Memory bool `json:"memory,omitempty"`
}

// InstanceRestore names the snapshot an instance is made from.
type InstanceRestore struct {
	SnapshotID string `json:"snapshotId"`
	SHA256     string `json:"sha256"`
	SizeBytes  int64  `json:"sizeBytes,omitempty"`
	// Memory says the snapshot holds a gVisor checkpoint: the processes
	// continue where they were.
	Memory bool `json:"memory,omitempty"`
}

// InstanceImage names an instance's image.
type InstanceImage struct {
	ID        string `json:"id"`
	Format    string `json:"format"` // raw, qcow2 or iso
	SHA256    string `json:"sha256"`
	SizeBytes int64  `json:"sizeBytes"`
}

// SSH is the node's sshd trust (nodes.issueSshCert): the certificate
// authorities whose user certificates sshd accepts and the revoked keys
// and certificates. `bcd` keeps sshd's TrustedUserCAKeys and RevokedKeys
// files equal to it.
type SSH struct {
	// TrustedUserCAKeys are public keys in authorized_keys format.
	TrustedUserCAKeys []string `json:"trustedUserCaKeys"`
	// RevokedKeys are the revoked certificates and keys, in
	// authorized_keys format (sshd's RevokedKeys takes such a file or a
	// KRL). bcd builds a KRL of them (ssh-keygen -k): a certificate line
	// revokes that certificate alone (its CA and serial), not its key.
	RevokedKeys []string `json:"revokedKeys"`
	// AuthorizedPrincipals are, per Unix user, the certificate principals
	// that log in as that user (sshd's AuthorizedPrincipalsFile): the
	// control plane names the node in each (<user>@<nodeId>), so a
	// certificate issued for another node never matches. A user not
	// listed accepts no certificate.
	AuthorizedPrincipals map[string][]string `json:"authorizedPrincipals,omitempty"`
}

// VMGuestPort is the one port of a VM its node reaches: the VM's host
// port forward (QEMU user-mode networking) goes to it, its sshd's.
const VMGuestPort = 22
