package dofake_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/providers/dofake"
)

const token = "dop_v1_fake_token"

var epoch = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// env is a fake on a real HTTP server, its clock, and godo pointed at it
// without retries, so every answer is seen as the fake gave it.
type env struct {
	fake  *dofake.Fake
	clock *dofake.ManualClock
	srv   *httptest.Server
	do    *godo.Client
}

func newEnv(t *testing.T, s dofake.Settings) *env {
	t.Helper()
	clock := dofake.NewManualClock(epoch)
	fake := dofake.New(dofake.Config{Settings: s, Tokens: []string{token}, Now: clock.Now})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	return &env{fake: fake, clock: clock, srv: srv, do: newClient(t, srv.URL, token)}
}

// bearer adds the token godo's oauth2 client would add.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func newClient(t *testing.T, url, token string) *godo.Client {
	t.Helper()
	c, err := godo.New(&http.Client{Transport: bearer{token}}, godo.SetBaseURL(url))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func basicCreate(name string, tags ...string) *godo.DropletCreateRequest {
	return &godo.DropletCreateRequest{
		Name: name, Region: "nyc3", Size: "s-2vcpu-4gb",
		Image: godo.DropletCreateImage{Slug: "ubuntu-24-04-x64"}, Tags: tags,
	}
}

func (e *env) create(t *testing.T, req *godo.DropletCreateRequest) *godo.Droplet {
	t.Helper()
	d, resp, err := e.do.Droplets.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create %s: %v", req.Name, err)
	}
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("create %s: status %d, want 202", req.Name, resp.StatusCode)
	}
	return d
}

func statusOf(err error) int {
	var er *godo.ErrorResponse
	if errors.As(err, &er) {
		return er.Response.StatusCode
	}
	return 0
}

func TestCatalog(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()

	// Regions, three to a page, following godo's own paging helpers.
	var regions []godo.Region
	for page := 1; ; page++ {
		rs, resp, err := e.do.Regions.List(ctx, &godo.ListOptions{Page: page, PerPage: 3})
		if err != nil {
			t.Fatal(err)
		}
		regions = append(regions, rs...)
		if cur, _ := resp.Links.CurrentPage(); cur != page {
			t.Fatalf("page %d: godo reads current page %d", page, cur)
		}
		if resp.Meta.Total != 10 {
			t.Fatalf("meta.total %d, want 10", resp.Meta.Total)
		}
		if resp.Links.IsLastPage() {
			break
		}
	}
	byRegion := map[string]godo.Region{}
	for _, r := range regions {
		byRegion[r.Slug] = r
	}
	if len(regions) != 10 || len(byRegion) != 10 {
		t.Fatalf("%d regions over the pages (%d distinct), want 10", len(regions), len(byRegion))
	}
	if r := byRegion["sfo1"]; r.Available || len(r.Sizes) != 0 {
		t.Errorf("sfo1 = %+v, want closed with no sizes", r)
	}
	if r := byRegion["nyc2"]; !r.Available || !slices.Contains(r.Sizes, "gpu-h100x1-80gb") || slices.Contains(r.Sizes, "s-1vcpu-1gb") {
		t.Errorf("nyc2 sizes = %v, want the GPU sizes only", r.Sizes)
	}

	sizes, _, err := e.do.Sizes.List(ctx, &godo.ListOptions{PerPage: 200})
	if err != nil {
		t.Fatal(err)
	}
	bySize := map[string]godo.Size{}
	for _, s := range sizes {
		bySize[s.Slug] = s
	}
	for _, tc := range []struct {
		slug                string
		vcpus, memory, disk int
		hourly, monthly     float64
		available           bool
		gpus                int
		gpuModel            string
	}{
		{"s-1vcpu-1gb", 1, 1024, 25, 0.00893, 6, true, 0, ""},
		{"s-2vcpu-4gb", 2, 4096, 80, 0.03571, 24, true, 0, ""},
		{"m-2vcpu-16gb", 2, 16384, 50, 0.125, 84, false, 0, ""},
		{"gpu-h100x1-80gb", 20, 245760, 720, 3.39, 2522.16, true, 1, "nvidia_h100"},
		{"gpu-h100x8-640gb", 160, 1966080, 2046, 23.92, 17796.48, true, 8, "nvidia_h100"},
	} {
		s, ok := bySize[tc.slug]
		switch {
		case !ok:
			t.Errorf("size %s missing", tc.slug)
		case s.Vcpus != tc.vcpus || s.Memory != tc.memory || s.Disk != tc.disk || s.PriceHourly != tc.hourly ||
			s.PriceMonthly != tc.monthly || s.Available != tc.available:
			t.Errorf("size %s = %+v", tc.slug, s)
		case tc.gpus == 0 && s.GPUInfo != nil:
			t.Errorf("size %s has gpu_info %+v", tc.slug, s.GPUInfo)
		case tc.gpus > 0 && (s.GPUInfo == nil || s.GPUInfo.Count != tc.gpus || s.GPUInfo.Model != tc.gpuModel || s.GPUInfo.VRAM == nil):
			t.Errorf("size %s gpu_info = %+v", tc.slug, s.GPUInfo)
		}
	}

	for _, tc := range []struct {
		name  string
		list  func(context.Context, *godo.ListOptions) ([]godo.Image, *godo.Response, error)
		slugs []string
	}{
		{"distribution", e.do.Images.ListDistribution, []string{"ubuntu-24-04-x64", "ubuntu-22-04-x64", "debian-12-x64", "fedora-40-x64"}},
		{"application", e.do.Images.ListApplication, []string{"docker-20-04"}},
		{"user", e.do.Images.ListUser, nil},
	} {
		images, _, err := tc.list(ctx, nil)
		if err != nil {
			t.Fatalf("%s images: %v", tc.name, err)
		}
		var slugs []string
		for _, im := range images {
			slugs = append(slugs, im.Slug)
		}
		if !slices.Equal(slugs, tc.slugs) {
			t.Errorf("%s images = %v, want %v", tc.name, slugs, tc.slugs)
		}
	}
	bySlug, _, err := e.do.Images.GetBySlug(ctx, "debian-12-x64")
	if err != nil {
		t.Fatal(err)
	}
	byID, _, err := e.do.Images.GetByID(ctx, bySlug.ID)
	if err != nil || byID.Slug != "debian-12-x64" || byID.Distribution != "Debian" || !byID.Public {
		t.Fatalf("image by id %d = %+v, %v", bySlug.ID, byID, err)
	}
	if _, _, err := e.do.Images.GetBySlug(ctx, "windows-11"); statusOf(err) != http.StatusNotFound {
		t.Fatalf("an unknown image: %v, want 404", err)
	}
}

func TestCreateValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*godo.DropletCreateRequest)
		status int
	}{
		{"unknown size", func(r *godo.DropletCreateRequest) { r.Size = "s-99vcpu" }, 422},
		{"unknown region", func(r *godo.DropletCreateRequest) { r.Region = "mars1" }, 422},
		{"closed region", func(r *godo.DropletCreateRequest) { r.Region = "sfo1" }, 422},
		{"unknown image slug", func(r *godo.DropletCreateRequest) { r.Image = godo.DropletCreateImage{Slug: "windows-11"} }, 422},
		{"unknown image id", func(r *godo.DropletCreateRequest) { r.Image = godo.DropletCreateImage{ID: 42} }, 422},
		{"unavailable size", func(r *godo.DropletCreateRequest) { r.Size = "m-2vcpu-16gb" }, 422},
		{"size not in the region", func(r *godo.DropletCreateRequest) { r.Size = "gpu-h100x1-80gb" }, 422},
		{"no name", func(r *godo.DropletCreateRequest) { r.Name = "" }, 422},
		{"not a hostname", func(r *godo.DropletCreateRequest) { r.Name = "web_1!" }, 422},
		{"bad tag", func(r *godo.DropletCreateRequest) { r.Tags = []string{"team a"} }, 422},
		{"user data too large", func(r *godo.DropletCreateRequest) { r.UserData = strings.Repeat("x", 64<<10+1) }, 422},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, dofake.Settings{})
			req := basicCreate("web-1")
			tc.mutate(req)
			_, resp, err := e.do.Droplets.Create(context.Background(), req)
			if statusOf(err) != tc.status {
				t.Fatalf("create: %v, want %d", err, tc.status)
			}
			if resp.Rate.Limit != dofake.DefaultPerHour {
				t.Errorf("a refusal's RateLimit-Limit %d", resp.Rate.Limit)
			}
			if n := e.fake.DropletsCreated(); n != 0 {
				t.Fatalf("%d droplets created by a refused request", n)
			}
		})
	}
	t.Run("by image id, in a GPU region", func(t *testing.T) {
		e := newEnv(t, dofake.Settings{})
		im, _, err := e.do.Images.GetBySlug(context.Background(), "ubuntu-22-04-x64")
		if err != nil {
			t.Fatal(err)
		}
		d := e.create(t, &godo.DropletCreateRequest{Name: "gpu-1", Region: "tor1", Size: "gpu-h100x1-80gb", Image: godo.DropletCreateImage{ID: im.ID}})
		if d.Image.Slug != "ubuntu-22-04-x64" || d.Size.GPUInfo == nil || d.Vcpus != 20 {
			t.Fatalf("droplet = %+v", d)
		}
	})
}

func TestDropletBootsAndGetsAnAddress(t *testing.T) {
	e := newEnv(t, dofake.Settings{BootDelay: 30 * time.Second})
	ctx := context.Background()
	req := basicCreate("web-1", "better-compute-managed", "better-compute-instance:i1")
	req.UserData = "#cloud-config\nruncmd: [echo hi]\n"
	d, resp, err := e.do.Droplets.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != "new" || d.Memory != 4096 || d.Vcpus != 2 || d.Disk != 80 || d.SizeSlug != "s-2vcpu-4gb" ||
		d.Region.Slug != "nyc3" || d.Image.Slug != "ubuntu-24-04-x64" || !slices.Equal(d.Tags, req.Tags) || d.Created != "2026-12-01T12:00:00Z" {
		t.Fatalf("created droplet = %+v", d)
	}
	if ip, err := d.PublicIPv4(); err != nil || ip != "" {
		t.Fatalf("a new droplet's public address %q, %v", ip, err)
	}
	if len(resp.Links.Actions) != 1 || resp.Links.Actions[0].Rel != "create" {
		t.Fatalf("create links = %+v", resp.Links)
	}
	createAction := resp.Links.Actions[0].ID

	if _, _, err := e.do.DropletActions.PowerOff(ctx, d.ID); statusOf(err) != 422 {
		t.Fatalf("power off while booting: %v, want 422 (a pending event)", err)
	}
	for _, step := range []struct {
		advance      time.Duration
		status       string
		actionStatus string
		publicIP     string
	}{
		{29 * time.Second, "new", "in-progress", ""},
		{time.Second, "active", "completed", "203.0.113.1"},
	} {
		e.clock.Advance(step.advance)
		got, _, err := e.do.Droplets.Get(ctx, d.ID)
		if err != nil {
			t.Fatal(err)
		}
		ip, _ := got.PublicIPv4()
		if got.Status != step.status || ip != step.publicIP {
			t.Fatalf("after %v: status %s, address %q; want %s, %q", step.advance, got.Status, ip, step.status, step.publicIP)
		}
		a, _, err := e.do.Actions.Get(ctx, createAction)
		if err != nil || a.Status != step.actionStatus || a.Type != "create" || a.ResourceID != d.ID || a.ResourceType != "droplet" {
			t.Fatalf("create action = %+v, %v", a, err)
		}
	}
	got, _, _ := e.do.Droplets.Get(ctx, d.ID)
	if private, _ := got.PrivateIPv4(); private != "10.110.0.1" || got.VPCUUID == "" {
		t.Fatalf("private address %q, vpc %q", private, got.VPCUUID)
	}
	records := e.fake.Droplets()
	if len(records) != 1 || records[0].UserData != req.UserData {
		t.Fatalf("records = %+v", records)
	}
}

func TestListingLag(t *testing.T) {
	e := newEnv(t, dofake.Settings{ListLag: 10 * time.Second})
	ctx := context.Background()
	d := e.create(t, basicCreate("web-1", "owner"))
	listed := func() map[string]int {
		all, _, err := e.do.Droplets.List(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		tagged, _, err := e.do.Droplets.ListByTag(ctx, "owner", nil)
		if err != nil {
			t.Fatal(err)
		}
		named, _, err := e.do.Droplets.ListByName(ctx, "web-1", nil)
		if err != nil {
			t.Fatal(err)
		}
		tag, _, err := e.do.Tags.Get(ctx, "owner")
		if err != nil {
			t.Fatal(err)
		}
		return map[string]int{"all": len(all), "tag": len(tagged), "name": len(named), "tagCount": tag.Resources.Count}
	}
	if got := listed(); got["all"]+got["tag"]+got["name"]+got["tagCount"] != 0 {
		t.Fatalf("just created, listed %v", got)
	}
	if got, _, err := e.do.Droplets.Get(ctx, d.ID); err != nil || got.ID != d.ID {
		t.Fatalf("get by id during the lag: %+v, %v", got, err)
	}
	if _, err := e.do.Droplets.DeleteByTag(ctx, "owner"); err != nil {
		t.Fatal(err)
	}
	if e.fake.Stats().DropletsLive != 1 {
		t.Fatal("delete by tag reached a droplet the tag index does not show yet")
	}
	e.clock.Advance(10 * time.Second)
	if got := listed(); got["all"] != 1 || got["tag"] != 1 || got["name"] != 1 || got["tagCount"] != 1 {
		t.Fatalf("after the lag, listed %v", got)
	}
}

func TestPaging(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	var ids []int
	for i := range 5 {
		ids = append(ids, e.create(t, basicCreate("web-"+string(rune('a'+i)), "pool")).ID)
	}
	for _, tc := range []struct {
		page, perPage int
		want          []int
		current       int
		last          bool
	}{
		{1, 2, ids[0:2], 1, false},
		{2, 2, ids[2:4], 2, false},
		{3, 2, ids[4:5], 3, true},
		{4, 2, nil, 4, true},
		{1, 0, ids, 1, true},
		{1, 500, ids, 1, true},
	} {
		ds, resp, err := e.do.Droplets.ListByTag(ctx, "pool", &godo.ListOptions{Page: tc.page, PerPage: tc.perPage})
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for _, d := range ds {
			got = append(got, d.ID)
		}
		cur, _ := resp.Links.CurrentPage()
		if !slices.Equal(got, tc.want) || resp.Meta.Total != 5 || resp.Links.IsLastPage() != tc.last || (tc.page > 1 && cur != tc.current) {
			t.Errorf("page %d of %d: ids %v (want %v), total %d, last %v, current %d; links %+v",
				tc.page, tc.perPage, got, tc.want, resp.Meta.Total, resp.Links.IsLastPage(), cur, resp.Links.Pages)
		}
		if next := resp.Links.Pages; next != nil && next.Next != "" && !strings.Contains(next.Next, "tag_name=pool") {
			t.Errorf("next link %q lost the tag filter", next.Next)
		}
	}
}

func TestTags(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	d := e.create(t, basicCreate("web-1"))
	tag, resp, err := e.do.Tags.Create(ctx, &godo.TagCreateRequest{Name: "better-compute-tenant:t1"})
	if err != nil || resp.StatusCode != http.StatusCreated || tag.Name != "better-compute-tenant:t1" {
		t.Fatalf("create tag: %+v, %v", tag, err)
	}
	resources := &godo.TagResourcesRequest{Resources: []godo.Resource{{ID: strconv.Itoa(d.ID), Type: godo.DropletResourceType}}}
	for _, tc := range []struct {
		name   string
		call   func() (*godo.Response, error)
		status int
		tagged int
	}{
		{"tag a droplet", func() (*godo.Response, error) { return e.do.Tags.TagResources(ctx, tag.Name, resources) }, 204, 1},
		{"tag it again", func() (*godo.Response, error) { return e.do.Tags.TagResources(ctx, tag.Name, resources) }, 204, 1},
		{"an unknown tag", func() (*godo.Response, error) { return e.do.Tags.TagResources(ctx, "nope", resources) }, 404, 1},
		{"an unknown droplet", func() (*godo.Response, error) {
			return e.do.Tags.TagResources(ctx, tag.Name, &godo.TagResourcesRequest{Resources: []godo.Resource{{ID: "1", Type: godo.DropletResourceType}}})
		}, 404, 1},
		{"untag", func() (*godo.Response, error) {
			return e.do.Tags.UntagResources(ctx, tag.Name, &godo.UntagResourcesRequest{Resources: resources.Resources})
		}, 204, 0},
	} {
		resp, err := tc.call()
		if got := resp.StatusCode; got != tc.status {
			t.Fatalf("%s: status %d (%v), want %d", tc.name, got, err, tc.status)
		}
		tagged, _, err := e.do.Droplets.ListByTag(ctx, tag.Name, nil)
		if err != nil || len(tagged) != tc.tagged {
			t.Fatalf("%s: %d droplets tagged, want %d (%v)", tc.name, len(tagged), tc.tagged, err)
		}
	}
	tags, _, err := e.do.Tags.List(ctx, nil)
	if err != nil || len(tags) != 1 || tags[0].Resources.Droplets == nil {
		t.Fatalf("tags = %+v, %v", tags, err)
	}
	if _, err := e.do.Tags.Delete(ctx, tag.Name); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.do.Tags.Get(ctx, tag.Name); statusOf(err) != 404 {
		t.Fatalf("a deleted tag: %v", err)
	}
}
