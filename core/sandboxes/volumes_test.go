package sandboxes

import "testing"

func TestMountPathRefused(t *testing.T) {
	for path, want := range map[string]string{
		"/data": "", "/home/user/work": "", "/devices": "", "/system": "",
		"data": "notAbsolute", "": "notAbsolute", "/data/": "notClean", "/data/../etc": "notClean", "//data": "notClean",
		"/": "root", "/proc": "reserved", "/proc/1": "reserved", "/sys/fs": "reserved", "/dev": "reserved", "/dev/shm": "reserved",
	} {
		if got := MountPathRefused(path); got != want {
			t.Errorf("MountPathRefused(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestAnsweredVolume(t *testing.T) {
	for _, c := range []struct {
		stored   string
		observed bool
		want     VolumeState
	}{
		{VolumeCreating, false, VolumeStateCreating}, {VolumeCreating, true, VolumeStateReady},
		{VolumeResizing, false, VolumeStateResizing}, {VolumeResizing, true, VolumeStateReady},
		{VolumeReady, true, VolumeStateReady}, {VolumeDeleting, false, VolumeStateDeleting},
		{VolumeDeleting, true, VolumeStateDeleted}, {VolumeFailed, false, VolumeStateFailed},
	} {
		if got := AnsweredVolume(c.stored, c.observed); got != c.want {
			t.Errorf("AnsweredVolume(%s, %v) = %s, want %s", c.stored, c.observed, got, c.want)
		}
	}
}
