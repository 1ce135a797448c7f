package dofake

import (
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// wireDroplet is a droplet as DigitalOcean answers it.
type wireDroplet struct {
	ID               int         `json:"id"`
	Name             string      `json:"name"`
	Memory           int         `json:"memory"`
	Vcpus            int         `json:"vcpus"`
	Disk             int         `json:"disk"`
	Locked           bool        `json:"locked"`
	Status           string      `json:"status"`
	Kernel           *struct{}   `json:"kernel"`
	CreatedAt        string      `json:"created_at"`
	Features         []string    `json:"features"`
	BackupIDs        []int       `json:"backup_ids"`
	NextBackupWindow *struct{}   `json:"next_backup_window"`
	SnapshotIDs      []int       `json:"snapshot_ids"`
	Image            Image       `json:"image"`
	VolumeIDs        []string    `json:"volume_ids"`
	Size             Size        `json:"size"`
	SizeSlug         string      `json:"size_slug"`
	Networks         wireNetwork `json:"networks"`
	Region           Region      `json:"region"`
	Tags             []string    `json:"tags"`
	VPCUUID          string      `json:"vpc_uuid"`
	GPUInfo          *GPUInfo    `json:"gpu_info,omitempty"`
	DiskInfo         []DiskInfo  `json:"disk_info,omitempty"`
}

type wireNetwork struct {
	V4 []wireV4 `json:"v4"`
	V6 []wireV6 `json:"v6"`
}

type wireV4 struct {
	IPAddress string `json:"ip_address"`
	Netmask   string `json:"netmask"`
	Gateway   string `json:"gateway"`
	Type      string `json:"type"`
}

type wireV6 struct {
	IPAddress string `json:"ip_address"`
	Netmask   int    `json:"netmask"`
	Gateway   string `json:"gateway"`
	Type      string `json:"type"`
}

type wireAction struct {
	ID           int     `json:"id"`
	Status       string  `json:"status"`
	Type         string  `json:"type"`
	StartedAt    string  `json:"started_at"`
	CompletedAt  *string `json:"completed_at"`
	ResourceID   int     `json:"resource_id"`
	ResourceType string  `json:"resource_type"`
	Region       *Region `json:"region"`
	RegionSlug   string  `json:"region_slug"`
}

type linkAction struct {
	ID   int    `json:"id"`
	Rel  string `json:"rel"`
	HREF string `json:"href"`
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func (st *state) wireDroplet(d *droplet) wireDroplet {
	size := *st.size(d.size)
	region := *st.region(d.region)
	features := []string{"private_networking"}
	if d.ipv6 {
		features = append(features, "ipv6")
	}
	nets := wireNetwork{V4: []wireV4{}, V6: []wireV6{}}
	if d.publicV4 != "" {
		pub := d.publicV4
		nets.V4 = append(nets.V4,
			wireV4{IPAddress: pub, Netmask: "255.255.255.0", Gateway: pub[:len(pub)-len(lastOctet(pub))] + "1", Type: "public"},
			wireV4{IPAddress: d.privateV4, Netmask: "255.255.240.0", Gateway: "10.110.0.1", Type: "private"})
	}
	if d.publicV6 != "" {
		nets.V6 = append(nets.V6, wireV6{IPAddress: d.publicV6, Netmask: 64, Gateway: "2001:db8:0:1::1", Type: "public"})
	}
	return wireDroplet{
		ID: d.id, Name: d.name, Memory: d.memory, Vcpus: d.vcpus, Disk: d.disk,
		Locked: d.pending != 0 && d.status != StatusNew, Status: d.status,
		CreatedAt: stamp(d.created), Features: features, BackupIDs: []int{}, SnapshotIDs: []int{},
		Image: d.image, VolumeIDs: []string{}, Size: size, SizeSlug: d.size, Networks: nets,
		Region: region, Tags: slices.Clone(d.tags), VPCUUID: vpcUUID(d.region),
		GPUInfo: size.GPUInfo, DiskInfo: size.DiskInfo,
	}
}

func lastOctet(ip string) string {
	for i := len(ip) - 1; i >= 0; i-- {
		if ip[i] == '.' {
			return ip[i+1:]
		}
	}
	return ip
}

func (st *state) wireAction(a *action) wireAction {
	w := wireAction{
		ID: a.id, Status: a.status(), Type: a.typ, StartedAt: stamp(a.started),
		ResourceID: a.dropletID, ResourceType: "droplet", RegionSlug: a.region,
	}
	if !a.completed.IsZero() {
		c := stamp(a.completed)
		w.CompletedAt = &c
	}
	if reg := st.region(a.region); reg != nil {
		r := *reg
		w.Region = &r
	}
	return w
}

// createRequest is POST /v2/droplets' body, one name or several.
type createRequest struct {
	Name     string          `json:"name"`
	Names    []string        `json:"names"`
	Region   string          `json:"region"`
	Size     string          `json:"size"`
	Image    json.RawMessage `json:"image"`
	Tags     []string        `json:"tags"`
	UserData string          `json:"user_data"`
	IPv6     bool            `json:"ipv6"`
}

var (
	hostnameRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9.-]{0,253}[a-zA-Z0-9])?$`)
	tagRE      = regexp.MustCompile(`^[a-zA-Z0-9_:-]{1,255}$`)
)

// maxUserData is DigitalOcean's limit on user data.
const maxUserData = 64 << 10

// maxNames is how many droplets one request may create.
const maxNames = 10

func (f *Fake) createDroplets(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	var req createRequest
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	multi := req.Names != nil
	names := req.Names
	if !multi {
		names = []string{req.Name}
	}
	if len(names) == 0 || len(names) > maxNames {
		return fail(http.StatusUnprocessableEntity, "You must specify between 1 and %d droplet names.", maxNames)
	}
	for _, n := range names {
		if n == "" {
			return fail(http.StatusUnprocessableEntity, "Name is required.")
		}
		if !hostnameRE.MatchString(n) {
			return fail(http.StatusUnprocessableEntity, "Name Only valid hostname characters are allowed. (a-z, A-Z, 0-9, . and -)")
		}
	}
	region := st.region(req.Region)
	if region == nil || !region.Available {
		return fail(http.StatusUnprocessableEntity, "You specified an invalid region for Droplet creation.")
	}
	size := st.size(req.Size)
	if size == nil {
		return fail(http.StatusUnprocessableEntity, "You specified an invalid size for Droplet creation.")
	}
	if !size.Available || !slices.Contains(size.Regions, region.Slug) {
		return fail(http.StatusUnprocessableEntity, "Size is not available in this region.")
	}
	image := st.requestedImage(req.Image)
	if image == nil {
		return fail(http.StatusUnprocessableEntity, "You specified an invalid image for Droplet creation.")
	}
	if !slices.Contains(image.Regions, region.Slug) {
		return fail(http.StatusUnprocessableEntity, "Image is not available in this region.")
	}
	if image.MinDiskSize > size.Disk {
		return fail(http.StatusUnprocessableEntity, "The image requires a disk of at least %d GB.", image.MinDiskSize)
	}
	for _, t := range req.Tags {
		if !tagRE.MatchString(t) {
			return fail(http.StatusUnprocessableEntity, "Tags may contain letters, numbers, colons, dashes, and underscores (at most 255).")
		}
	}
	if len(req.UserData) > maxUserData {
		return fail(http.StatusUnprocessableEntity, "User data is limited to %d bytes.", maxUserData)
	}

	var created []wireDroplet
	var links []linkAction
	for _, name := range names {
		st.nextDroplet++
		st.created++
		d := &droplet{
			id: st.nextDroplet, seq: st.created, name: name, region: region.Slug, size: size.Slug,
			memory: size.Memory, vcpus: size.Vcpus, disk: size.Disk, image: *image,
			tags: dedupe(req.Tags), userData: req.UserData, ipv6: req.IPv6, status: StatusNew,
			created: now, listedAt: now.Add(st.settings.ListLag),
		}
		for _, t := range d.tags {
			st.tags[t] = true
		}
		st.droplets[d.id] = d
		a := st.startAction(d, "create", now, st.settings.BootDelay)
		created = append(created, st.wireDroplet(d))
		links = append(links, linkAction{ID: a.id, Rel: "create", HREF: baseURL(r) + "/v2/actions/" + strconv.Itoa(a.id)})
	}
	out := map[string]any{"links": map[string]any{"actions": links}}
	if multi {
		out["droplets"] = created
	} else {
		out["droplet"] = created[0]
	}
	return http.StatusAccepted, out
}

// requestedImage resolves a create's image, a slug or an id.
func (st *state) requestedImage(raw json.RawMessage) *Image {
	var id int
	if err := json.Unmarshal(raw, &id); err == nil {
		return st.imageByID(id)
	}
	var slug string
	if err := json.Unmarshal(raw, &slug); err == nil {
		return st.imageBySlug(slug)
	}
	return nil
}

func dedupe(tags []string) []string {
	out := []string{}
	for _, t := range tags {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

func (f *Fake) listDroplets(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	q := r.URL.Query()
	var out []wireDroplet
	for _, d := range st.listed(now) {
		if tag := q.Get("tag_name"); tag != "" && !slices.Contains(d.tags, tag) {
			continue
		}
		if name := q.Get("name"); name != "" && d.name != name {
			continue
		}
		if q.Get("type") == "gpus" && st.size(d.size).GPUInfo == nil {
			continue
		}
		out = append(out, st.wireDroplet(d))
	}
	return paged(r, "droplets", out)
}

func (st *state) dropletFrom(r *http.Request) *droplet {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		return nil
	}
	return st.droplets[id]
}

func (f *Fake) getDroplet(r *http.Request, _ time.Time) (int, any) {
	d := f.st.dropletFrom(r)
	if d == nil {
		return notFoundAnswer()
	}
	return http.StatusOK, map[string]any{"droplet": f.st.wireDroplet(d)}
}

func (f *Fake) deleteDroplet(r *http.Request, _ time.Time) (int, any) {
	d := f.st.dropletFrom(r)
	if d == nil {
		return notFoundAnswer()
	}
	delete(f.st.droplets, d.id)
	return http.StatusNoContent, nil
}

func (f *Fake) deleteDropletsByTag(r *http.Request, now time.Time) (int, any) {
	tag := r.URL.Query().Get("tag_name")
	if tag == "" {
		return fail(http.StatusUnprocessableEntity, "tag_name is required to delete droplets in bulk.")
	}
	for _, d := range f.st.listed(now) {
		if slices.Contains(d.tags, tag) {
			delete(f.st.droplets, d.id)
		}
	}
	return http.StatusNoContent, nil
}

// actionRequest is POST /v2/droplets/{id}/actions' body.
type actionRequest struct {
	Type string `json:"type"`
	Size string `json:"size"`
	Disk bool   `json:"disk"`
}

func (f *Fake) postDropletAction(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	d := st.dropletFrom(r)
	if d == nil {
		return notFoundAnswer()
	}
	var req actionRequest
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	switch req.Type {
	case "power_on", "power_off", "shutdown", "reboot", "power_cycle", "resize":
	case "":
		return fail(http.StatusUnprocessableEntity, "Action type is required.")
	default:
		return fail(http.StatusUnprocessableEntity, "The fake does not model the action type %q.", req.Type)
	}
	if d.pending != 0 {
		return fail(http.StatusUnprocessableEntity, "Droplet already has a pending event.")
	}
	switch req.Type {
	case "power_on":
		if d.status == StatusActive {
			return fail(http.StatusUnprocessableEntity, "Droplet is already powered on.")
		}
	case "power_off", "shutdown":
		if d.status == StatusOff {
			return fail(http.StatusUnprocessableEntity, "Droplet is already powered off.")
		}
	case "reboot", "power_cycle":
		if d.status != StatusActive {
			return fail(http.StatusUnprocessableEntity, "Droplet is not powered on.")
		}
	case "resize":
		size := st.size(req.Size)
		if size == nil {
			return fail(http.StatusUnprocessableEntity, "You specified an invalid size for Droplet resize.")
		}
		if !size.Available || !slices.Contains(size.Regions, d.region) {
			return fail(http.StatusUnprocessableEntity, "Size is not available in this region.")
		}
		if d.status != StatusOff {
			return fail(http.StatusUnprocessableEntity, "Droplet must be powered off before it is resized.")
		}
		if size.Disk < d.disk {
			return fail(http.StatusUnprocessableEntity, "A droplet's disk cannot shrink: %s has a %d GB disk, this droplet %d GB.", size.Slug, size.Disk, d.disk)
		}
	}
	a := st.startAction(d, req.Type, now, st.settings.ActionDelay)
	a.size, a.resizeDisk = req.Size, req.Disk
	return http.StatusCreated, map[string]any{"action": st.wireAction(a)}
}

func (f *Fake) listDropletActions(r *http.Request, _ time.Time) (int, any) {
	d := f.st.dropletFrom(r)
	if d == nil {
		return notFoundAnswer()
	}
	var out []wireAction
	for _, a := range f.st.sortedActions() {
		if a.dropletID == d.id {
			out = append(out, f.st.wireAction(a))
		}
	}
	return paged(r, "actions", out)
}

func (f *Fake) getDropletAction(r *http.Request, _ time.Time) (int, any) {
	droplet, err1 := strconv.Atoi(r.PathValue("id"))
	id, err2 := strconv.Atoi(r.PathValue("actionId"))
	a := f.st.actions[id]
	if err1 != nil || err2 != nil || a == nil || a.dropletID != droplet {
		return notFoundAnswer()
	}
	return http.StatusOK, map[string]any{"action": f.st.wireAction(a)}
}

func (f *Fake) listActions(r *http.Request, _ time.Time) (int, any) {
	var out []wireAction
	for _, a := range f.st.sortedActions() {
		out = append(out, f.st.wireAction(a))
	}
	return paged(r, "actions", out)
}

func (f *Fake) getAction(r *http.Request, _ time.Time) (int, any) {
	id, err := strconv.Atoi(r.PathValue("id"))
	a := f.st.actions[id]
	if err != nil || a == nil {
		return notFoundAnswer()
	}
	return http.StatusOK, map[string]any{"action": f.st.wireAction(a)}
}

func (st *state) sortedActions() []*action {
	out := make([]*action, 0, len(st.actions))
	for _, a := range st.actions {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b *action) int { return a.id - b.id })
	return out
}
