package dofake

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"time"
)

// Droplet statuses.
const (
	StatusNew    = "new"
	StatusActive = "active"
	StatusOff    = "off"
)

// Action statuses.
const (
	ActionInProgress = "in-progress"
	ActionCompleted  = "completed"
)

// First ids, far apart so a droplet's id is never mistaken for an action's.
const (
	firstDropletID = 500000000
	firstActionID  = 900000000
)

type droplet struct {
	id                  int
	name                string
	region              string
	size                string
	memory, vcpus, disk int
	image               Image
	tags                []string
	userData            string
	ipv6                bool
	status              string
	created, listedAt   time.Time
	publicV4, privateV4 string
	publicV6            string
	pending             int // the action in progress, 0 when none
	seq                 int // the droplet's number, for its addresses
}

type action struct {
	id        int
	typ       string
	started   time.Time
	due       time.Time
	completed time.Time
	dropletID int
	region    string
	// resize's parameters
	size       string
	resizeDisk bool
}

func (a *action) status() string {
	if a.completed.IsZero() {
		return ActionInProgress
	}
	return ActionCompleted
}

type state struct {
	settings Settings
	tokens   map[string]bool
	regions  []Region
	sizes    []Size
	images   []Image

	droplets map[int]*droplet
	actions  map[int]*action
	// inFlight are the ids of actions not completed, oldest first.
	inFlight []int
	tags     map[string]bool
	faults   faultList

	nextDroplet, nextAction int
	created                 int
	requests                map[string]int

	resources
}

func newState(cfg Config) state {
	st := state{
		settings:    cfg.Settings.normalized(),
		tokens:      map[string]bool{},
		regions:     cfg.Regions,
		sizes:       cfg.Sizes,
		images:      cfg.Images,
		droplets:    map[int]*droplet{},
		actions:     map[int]*action{},
		tags:        map[string]bool{},
		nextDroplet: firstDropletID,
		nextAction:  firstActionID,
		requests:    map[string]int{},
		resources:   newResources(),
	}
	if st.regions == nil {
		st.regions = DefaultRegions()
	}
	if st.sizes == nil {
		st.sizes = DefaultSizes()
	}
	if st.images == nil {
		st.images = DefaultImages()
	}
	for i := range st.regions {
		reg := &st.regions[i]
		reg.Sizes = []string{}
		for _, s := range st.sizes {
			if slices.Contains(s.Regions, reg.Slug) && reg.Available {
				reg.Sizes = append(reg.Sizes, s.Slug)
			}
		}
	}
	return st
}

// settle completes every action due by now, in the order they started,
// and applies its effect: the state as it would be had time passed.
func (st *state) settle(now time.Time) {
	kept := st.inFlight[:0]
	for _, id := range st.inFlight {
		a := st.actions[id]
		if a.due.After(now) {
			kept = append(kept, id)
			continue
		}
		a.completed = a.due
		d := st.droplets[a.dropletID]
		if d == nil {
			continue
		}
		if d.pending == a.id {
			d.pending = 0
		}
		switch a.typ {
		case "create", "power_on", "reboot", "power_cycle":
			d.status = StatusActive
			if d.publicV4 == "" {
				d.publicV4, d.privateV4 = addresses(d.seq)
				if d.ipv6 {
					d.publicV6 = fmt.Sprintf("2001:db8:0:1::%x", d.seq)
				}
			}
		case "power_off", "shutdown":
			d.status = StatusOff
		case "resize":
			s := st.size(a.size)
			d.size, d.memory, d.vcpus = s.Slug, s.Memory, s.Vcpus
			if a.resizeDisk {
				d.disk = s.Disk
			}
		}
	}
	st.inFlight = kept
	st.settleResources(now)
}

// addresses are a droplet's public IPv4 (in the documentation ranges, so
// nothing real is ever reached) and its VPC address.
func addresses(seq int) (public, private string) {
	pools := []string{"203.0.113", "198.51.100", "192.0.2"}
	i := (seq - 1) % (len(pools) * 254)
	public = fmt.Sprintf("%s.%d", pools[i/254], i%254+1)
	private = fmt.Sprintf("10.110.%d.%d", ((seq-1)/254)%256, (seq-1)%254+1)
	return public, private
}

// startAction begins an action on d that completes after delay.
func (st *state) startAction(d *droplet, typ string, now time.Time, delay time.Duration) *action {
	st.nextAction++
	a := &action{id: st.nextAction, typ: typ, started: now, due: now.Add(delay), dropletID: d.id, region: d.region}
	st.actions[a.id] = a
	st.inFlight = append(st.inFlight, a.id)
	d.pending = a.id
	return a
}

func (st *state) region(slug string) *Region {
	for i := range st.regions {
		if st.regions[i].Slug == slug {
			return &st.regions[i]
		}
	}
	return nil
}

func (st *state) size(slug string) *Size {
	for i := range st.sizes {
		if st.sizes[i].Slug == slug {
			return &st.sizes[i]
		}
	}
	return nil
}

func (st *state) imageByID(id int) *Image {
	for i := range st.images {
		if st.images[i].ID == id {
			return &st.images[i]
		}
	}
	return nil
}

func (st *state) imageBySlug(slug string) *Image {
	for i := range st.images {
		if st.images[i].Slug == slug && slug != "" {
			return &st.images[i]
		}
	}
	return nil
}

// listed answers the droplets a listing shows at now, by id.
func (st *state) listed(now time.Time) []*droplet {
	var out []*droplet
	for _, d := range st.droplets {
		if !d.listedAt.After(now) {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b *droplet) int { return a.id - b.id })
	return out
}

// vpcUUID is a region's default VPC, stable for the region.
func vpcUUID(region string) string {
	h := sha256.Sum256([]byte("vpc:" + region))
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}
