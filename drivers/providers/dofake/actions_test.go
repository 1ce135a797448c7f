package dofake_test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/providers/dofake"
)

func TestDropletActions(t *testing.T) {
	const delay = 5 * time.Second
	e := newEnv(t, dofake.Settings{ActionDelay: delay})
	ctx := context.Background()
	d := e.create(t, basicCreate("web-1"))
	e.clock.Advance(time.Millisecond) // booted: BootDelay is zero
	acts := e.do.DropletActions

	// One droplet through a sequence of actions: each either refused with
	// 422 (and nothing changes) or in progress until the clock passes the
	// action delay, then completed with its effect.
	for _, step := range []struct {
		name   string
		call   func() (*godo.Action, *godo.Response, error)
		status int
		after  string // the droplet's status once the action completed
		size   string
		memory int
		disk   int
	}{
		{"resize while on", func() (*godo.Action, *godo.Response, error) { return acts.Resize(ctx, d.ID, "s-4vcpu-8gb", true) }, 422, "active", "s-2vcpu-4gb", 4096, 80},
		{"power on while on", func() (*godo.Action, *godo.Response, error) { return acts.PowerOn(ctx, d.ID) }, 422, "active", "s-2vcpu-4gb", 4096, 80},
		{"reboot", func() (*godo.Action, *godo.Response, error) { return acts.Reboot(ctx, d.ID) }, 201, "active", "s-2vcpu-4gb", 4096, 80},
		{"power off", func() (*godo.Action, *godo.Response, error) { return acts.PowerOff(ctx, d.ID) }, 201, "off", "s-2vcpu-4gb", 4096, 80},
		{"power off while off", func() (*godo.Action, *godo.Response, error) { return acts.PowerOff(ctx, d.ID) }, 422, "off", "s-2vcpu-4gb", 4096, 80},
		{"resize to an unknown size", func() (*godo.Action, *godo.Response, error) { return acts.Resize(ctx, d.ID, "s-64vcpu", true) }, 422, "off", "s-2vcpu-4gb", 4096, 80},
		{"resize to a smaller disk", func() (*godo.Action, *godo.Response, error) { return acts.Resize(ctx, d.ID, "s-1vcpu-1gb", true) }, 422, "off", "s-2vcpu-4gb", 4096, 80},
		{"resize to a GPU size not in the region", func() (*godo.Action, *godo.Response, error) { return acts.Resize(ctx, d.ID, "gpu-h100x1-80gb", true) }, 422, "off", "s-2vcpu-4gb", 4096, 80},
		{"resize CPU and memory only", func() (*godo.Action, *godo.Response, error) { return acts.Resize(ctx, d.ID, "g-2vcpu-8gb", false) }, 422, "off", "s-2vcpu-4gb", 4096, 80},
		{"resize with the disk", func() (*godo.Action, *godo.Response, error) { return acts.Resize(ctx, d.ID, "s-4vcpu-8gb", true) }, 201, "off", "s-4vcpu-8gb", 8192, 160},
		{"power on", func() (*godo.Action, *godo.Response, error) { return acts.PowerOn(ctx, d.ID) }, 201, "active", "s-4vcpu-8gb", 8192, 160},
		{"shutdown", func() (*godo.Action, *godo.Response, error) { return acts.Shutdown(ctx, d.ID) }, 201, "off", "s-4vcpu-8gb", 8192, 160},
		{"reboot while off", func() (*godo.Action, *godo.Response, error) { return acts.Reboot(ctx, d.ID) }, 422, "off", "s-4vcpu-8gb", 8192, 160},
	} {
		a, resp, err := step.call()
		if resp == nil || resp.StatusCode != step.status {
			t.Fatalf("%s: %v, want %d", step.name, err, step.status)
		}
		if step.status == http.StatusCreated {
			if a.Status != "in-progress" || a.CompletedAt != nil || a.ResourceID != d.ID || a.RegionSlug != "nyc3" {
				t.Fatalf("%s: action = %+v", step.name, a)
			}
			if _, _, err := acts.PowerCycle(ctx, d.ID); statusOf(err) != 422 {
				t.Fatalf("%s: a second action while one is in progress: %v, want 422", step.name, err)
			}
			e.clock.Advance(delay - time.Millisecond)
			if got, _, err := acts.Get(ctx, d.ID, a.ID); err != nil || got.Status != "in-progress" {
				t.Fatalf("%s: before the delay, action %+v, %v", step.name, got, err)
			}
			e.clock.Advance(time.Millisecond)
			got, _, err := e.do.Actions.Get(ctx, a.ID)
			if err != nil || got.Status != "completed" || got.CompletedAt == nil || got.Type != a.Type {
				t.Fatalf("%s: after the delay, action %+v, %v", step.name, got, err)
			}
		}
		got, _, err := e.do.Droplets.Get(ctx, d.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != step.after || got.SizeSlug != step.size || got.Memory != step.memory || got.Disk != step.disk {
			t.Fatalf("%s: droplet %s %s %d MiB %d GB, want %s %s %d MiB %d GB", step.name,
				got.Status, got.SizeSlug, got.Memory, got.Disk, step.after, step.size, step.memory, step.disk)
		}
	}
	// create, reboot, power off, resize, power on, shutdown
	list, resp, err := e.do.Droplets.Actions(ctx, d.ID, nil)
	if err != nil || len(list) != 6 || resp.Meta.Total != 6 || list[0].Type != "create" || list[5].Type != "shutdown" {
		t.Fatalf("the droplet's actions: %d, %v", len(list), err)
	}
	if _, _, err := acts.Get(ctx, d.ID+1, 900000001); statusOf(err) != 404 {
		t.Fatalf("another droplet's action: %v, want 404", err)
	}
}

func TestDelete(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	a := e.create(t, basicCreate("a", "group"))
	b := e.create(t, basicCreate("b", "group"))
	c := e.create(t, basicCreate("c", "other"))
	for _, step := range []struct {
		name   string
		call   func() (*godo.Response, error)
		status int
		live   []int
	}{
		{"delete one", func() (*godo.Response, error) { return e.do.Droplets.Delete(ctx, a.ID) }, 204, []int{b.ID, c.ID}},
		{"delete it again", func() (*godo.Response, error) { return e.do.Droplets.Delete(ctx, a.ID) }, 404, []int{b.ID, c.ID}},
		{"delete by tag", func() (*godo.Response, error) { return e.do.Droplets.DeleteByTag(ctx, "group") }, 204, []int{c.ID}},
		{"delete by a tag nobody has", func() (*godo.Response, error) { return e.do.Droplets.DeleteByTag(ctx, "group") }, 204, []int{c.ID}},
	} {
		resp, err := step.call()
		if resp.StatusCode != step.status {
			t.Fatalf("%s: %d %v, want %d", step.name, resp.StatusCode, err, step.status)
		}
		var live []int
		for _, d := range e.fake.Droplets() {
			live = append(live, d.ID)
		}
		if !slices.Equal(live, step.live) {
			t.Fatalf("%s: live %v, want %v", step.name, live, step.live)
		}
	}
	if _, _, err := e.do.Droplets.Get(ctx, a.ID); statusOf(err) != 404 {
		t.Fatalf("a deleted droplet: %v, want 404", err)
	}
	if s := e.fake.Stats(); s.DropletsCreated != 3 || s.DropletsLive != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCreateMultiple(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ds, resp, err := e.do.Droplets.CreateMultiple(context.Background(), &godo.DropletMultiCreateRequest{
		Names: []string{"a", "b", "c"}, Region: "ams3", Size: "s-1vcpu-1gb", Image: godo.DropletCreateImage{Slug: "debian-12-x64"},
	})
	if err != nil || len(ds) != 3 || len(resp.Links.Actions) != 3 {
		t.Fatalf("create multiple: %d droplets, %+v, %v", len(ds), resp.Links, err)
	}
	if e.fake.DropletsCreated() != 3 {
		t.Fatal("not three created")
	}
}
