package dofake

import "slices"

// Region is a region as GET /v2/regions answers it. Sizes is derived from
// the sizes offered there, so a Config never states it twice.
type Region struct {
	Slug      string   `json:"slug"`
	Name      string   `json:"name"`
	Features  []string `json:"features"`
	Available bool     `json:"available"`
	Sizes     []string `json:"sizes"`
}

// GPUInfo is a GPU size's accelerators.
type GPUInfo struct {
	Count int    `json:"count"`
	VRAM  Amount `json:"vram"`
	Model string `json:"model"`
}

// Amount is a quantity with its unit ("gib").
type Amount struct {
	Amount int    `json:"amount"`
	Unit   string `json:"unit"`
}

// DiskInfo is one disk of a size.
type DiskInfo struct {
	Type string `json:"type"`
	Size Amount `json:"size"`
}

// Size is a machine size as GET /v2/sizes answers it: memory in MiB, disk
// in GiB, prices in US dollars.
type Size struct {
	Slug         string     `json:"slug"`
	Memory       int        `json:"memory"`
	Vcpus        int        `json:"vcpus"`
	Disk         int        `json:"disk"`
	Transfer     float64    `json:"transfer"`
	PriceMonthly float64    `json:"price_monthly"`
	PriceHourly  float64    `json:"price_hourly"`
	Regions      []string   `json:"regions"`
	Available    bool       `json:"available"`
	Description  string     `json:"description"`
	DiskInfo     []DiskInfo `json:"disk_info,omitempty"`
	GPUInfo      *GPUInfo   `json:"gpu_info,omitempty"`
}

// Image kinds, the values GET /v2/images?type= filters on.
const (
	ImageDistribution = "distribution"
	ImageApplication  = "application"
)

// Image is a public image as GET /v2/images answers it. Kind is not on the
// wire: it is what ?type= matches (DigitalOcean's own "type" field says
// "base" for distribution images).
type Image struct {
	ID            int      `json:"id"`
	Name          string   `json:"name"`
	Distribution  string   `json:"distribution"`
	Slug          string   `json:"slug"`
	Public        bool     `json:"public"`
	Regions       []string `json:"regions"`
	CreatedAt     string   `json:"created_at"`
	Type          string   `json:"type"`
	MinDiskSize   int      `json:"min_disk_size"`
	SizeGigabytes float64  `json:"size_gigabytes"`
	Description   string   `json:"description"`
	Tags          []string `json:"tags"`
	Status        string   `json:"status"`
	ErrorMessage  string   `json:"error_message"`
	Kind          string   `json:"-"`
}

var generalRegions = []string{"nyc1", "nyc3", "sfo3", "ams3", "fra1", "lon1", "sgp1", "tor1"}

// DefaultRegions are the regions a Fake serves when its Config names none:
// DigitalOcean's general regions, the GPU region nyc2, and sfo1, which is
// listed but closed to new droplets.
func DefaultRegions() []Region {
	names := map[string]string{
		"nyc1": "New York 1", "nyc2": "New York 2", "nyc3": "New York 3", "sfo1": "San Francisco 1",
		"sfo3": "San Francisco 3", "ams3": "Amsterdam 3", "fra1": "Frankfurt 1", "lon1": "London 1",
		"sgp1": "Singapore 1", "tor1": "Toronto 1",
	}
	features := func() []string {
		return []string{"backups", "ipv6", "metadata", "install_agent", "storage", "image_transfer"}
	}
	var out []Region
	for _, slug := range []string{"nyc1", "nyc2", "nyc3", "sfo1", "sfo3", "ams3", "fra1", "lon1", "sgp1", "tor1"} {
		out = append(out, Region{Slug: slug, Name: names[slug], Features: features(), Available: slug != "sfo1"})
	}
	return out
}

// DefaultSizes are the sizes a Fake serves when its Config names none:
// shapes and prices modelled on DigitalOcean's public list (prices change;
// these are fixed), two GPU sizes with gpu_info, and one that is not
// available.
func DefaultSizes() []Size {
	local := func(gib int) []DiskInfo { return []DiskInfo{{Type: "local", Size: Amount{gib, "gib"}}} }
	basic := func(slug string, vcpus, memMiB, disk int, transfer, monthly, hourly float64, desc string) Size {
		return Size{Slug: slug, Memory: memMiB, Vcpus: vcpus, Disk: disk, Transfer: transfer,
			PriceMonthly: monthly, PriceHourly: hourly, Regions: slices.Clone(generalRegions),
			Available: true, Description: desc, DiskInfo: local(disk)}
	}
	gpuRegions := func() []string { return []string{"nyc2", "tor1"} }
	return []Size{
		basic("s-1vcpu-1gb", 1, 1024, 25, 1, 6, 0.00893, "Basic"),
		basic("s-1vcpu-2gb", 1, 2048, 50, 2, 12, 0.01786, "Basic"),
		basic("s-2vcpu-2gb", 2, 2048, 60, 3, 18, 0.02679, "Basic"),
		basic("s-2vcpu-4gb", 2, 4096, 80, 4, 24, 0.03571, "Basic"),
		basic("s-4vcpu-8gb", 4, 8192, 160, 5, 48, 0.07143, "Basic"),
		basic("c-4", 4, 8192, 50, 5, 84, 0.125, "CPU-Optimized"),
		basic("g-2vcpu-8gb", 2, 8192, 25, 4, 63, 0.09375, "General Purpose"),
		{
			Slug: "m-2vcpu-16gb", Memory: 16384, Vcpus: 2, Disk: 50, Transfer: 4, PriceMonthly: 84, PriceHourly: 0.125,
			Regions: []string{}, Available: false, Description: "Memory-Optimized", DiskInfo: local(50),
		},
		{
			Slug: "gpu-l40sx1-48gb", Memory: 65536, Vcpus: 8, Disk: 500, Transfer: 10,
			PriceMonthly: 1168.08, PriceHourly: 1.57, Regions: gpuRegions(), Available: true,
			Description: "GPU L40S 1X", DiskInfo: local(500),
			GPUInfo: &GPUInfo{Count: 1, VRAM: Amount{48, "gib"}, Model: "nvidia_l40s"},
		},
		{
			Slug: "gpu-h100x1-80gb", Memory: 245760, Vcpus: 20, Disk: 720, Transfer: 15,
			PriceMonthly: 2522.16, PriceHourly: 3.39, Regions: gpuRegions(), Available: true,
			Description: "GPU H100 1X", DiskInfo: []DiskInfo{{Type: "local", Size: Amount{720, "gib"}}, {Type: "scratch", Size: Amount{5120, "gib"}}},
			GPUInfo: &GPUInfo{Count: 1, VRAM: Amount{80, "gib"}, Model: "nvidia_h100"},
		},
		{
			Slug: "gpu-h100x8-640gb", Memory: 1966080, Vcpus: 160, Disk: 2046, Transfer: 60,
			PriceMonthly: 17796.48, PriceHourly: 23.92, Regions: gpuRegions(), Available: true,
			Description: "GPU H100 8X", DiskInfo: []DiskInfo{{Type: "local", Size: Amount{2046, "gib"}}, {Type: "scratch", Size: Amount{40960, "gib"}}},
			GPUInfo: &GPUInfo{Count: 8, VRAM: Amount{640, "gib"}, Model: "nvidia_h100"},
		},
	}
}

// DefaultImages are the public images a Fake serves when its Config names
// none: four distribution images in every region and one application
// image.
func DefaultImages() []Image {
	all := func() []string {
		return []string{"nyc1", "nyc2", "nyc3", "sfo3", "ams3", "fra1", "lon1", "sgp1", "tor1"}
	}
	dist := func(id int, slug, dist, name string, min int, gb float64) Image {
		return Image{ID: id, Name: name, Distribution: dist, Slug: slug, Public: true, Regions: all(),
			CreatedAt: "2024-04-24T12:00:00Z", Type: "base", MinDiskSize: min, SizeGigabytes: gb,
			Description: dist + " " + name, Tags: []string{}, Status: "available", Kind: ImageDistribution}
	}
	return []Image{
		dist(155000001, "ubuntu-24-04-x64", "Ubuntu", "24.04 (LTS) x64", 7, 2.36),
		dist(155000002, "ubuntu-22-04-x64", "Ubuntu", "22.04 (LTS) x64", 7, 2.22),
		dist(155000003, "debian-12-x64", "Debian", "12 x64", 7, 1.05),
		dist(155000004, "fedora-40-x64", "Fedora", "40 x64", 7, 1.71),
		{
			ID: 155000101, Name: "Docker on Ubuntu 22.04", Distribution: "Ubuntu", Slug: "docker-20-04",
			Public: true, Regions: all(), CreatedAt: "2024-04-24T12:00:00Z", Type: "snapshot", MinDiskSize: 25,
			SizeGigabytes: 3.7, Description: "Docker", Tags: []string{}, Status: "available", Kind: ImageApplication,
		},
	}
}
