# The two commands a newcomer needs: `make run` and `make test`.
SHELL := /bin/bash
GO    ?= go
PKG   := github.com/better-compute/better-compute
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X $(PKG)/internal/buildinfo.Version=$(VERSION) -X $(PKG)/internal/buildinfo.Commit=$(COMMIT)
# The whole suite, integration tests included; stays under 15 minutes on 2 cores.
TEST_TIMEOUT ?= 20m
# How long `make test` fuzzes the call envelope (api.FuzzEnvelope) after the
# suite; its first ~10 s start the server and replay the corpus.
FUZZ_TIME ?= 20s
# go-nvml's cgo preamble uses NVML calls its headers mark deprecated.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all build run test lint bench clean kernel ramdisk testdisk testimage

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/better-compute ./cmd/better-compute
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/bcd ./cmd/bcd

# Everything on this machine: PostgreSQL, Temporal and its UI, the API, a worker.
run: build
	@$(MAKE) --no-print-directory testimage || echo "make run: no demo instance image (make testimage needs Debian's busybox-static and squashfs-tools); the dev stack runs without one"
	./bin/better-compute dev

test: kernel testdisk
	BETTER_COMPUTE_KERNEL_DIR=$(KERNEL_DIR) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(GO) test -run '^$$' -fuzz '^FuzzEnvelope$$' -fuzztime $(FUZZ_TIME) ./api/

# gofmt, vet, and the direction of imports (tools/importcheck holds the rules).
lint:
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt would change:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./tools/importcheck

bench:
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m ./...

clean:
	rm -rf bin

# The ramdisk's kernel: Debian's cloud kernel (virtio drivers as modules, no
# hardware drivers to probe, so it boots fastest under TCG), fetched once with
# apt-get download into a cache outside the tree and unpacked with dpkg -x.
# Tests read it and never fetch it.
KERNEL_CACHE   ?= $(HOME)/.cache/better-compute/kernel
KERNEL_FLAVOUR ?= cloud-amd64
KERNEL_DIR     := $(KERNEL_CACHE)/root
kernel: $(KERNEL_DIR)/.unpacked

$(KERNEL_DIR)/.unpacked:
	@set -e; mkdir -p $(KERNEL_CACHE); cd $(KERNEL_CACHE); \
	pkg=$$(apt-cache depends linux-image-$(KERNEL_FLAVOUR) | awk '/Depends: linux-image-/{print $$2; exit}'); \
	if [ -z "$$pkg" ]; then echo "kernel: apt-cache knows no linux-image-$(KERNEL_FLAVOUR) (run apt-get update)"; exit 1; fi; \
	rm -rf dl root.tmp; mkdir dl; (cd dl && apt-get download "$$pkg"); \
	dpkg -x dl/*.deb root.tmp; rm -rf root dl; mv root.tmp root; touch root/.unpacked; \
	echo "kernel: $$pkg in $(KERNEL_DIR)"

# The ramdisk's base boot pieces (vmlinuz, initrd.img) in $(RAMDISK_OUT),
# with a static bcd: the ramdisk has no libc for cgo's NVML.
RAMDISK_OUT ?= bin/ramdisk
ramdisk: kernel
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(RAMDISK_OUT)/bcd ./cmd/bcd
	$(GO) run ./tools/ramdisk -kernel-dir $(KERNEL_DIR) -bcd $(RAMDISK_OUT)/bcd -out $(RAMDISK_OUT)

# The small bootable test disk (docs/testdisk.md): an MBR and one FAT32
# partition with syslinux, the kernel and an initramfs whose /init runs
# `bcd node firstboot` on the disk's CIDATA seed, in $(TESTDISK_OUT).
# Needs Debian's syslinux, syslinux-common and mtools.
TESTDISK_OUT ?= bin/testdisk
testdisk: kernel
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(TESTDISK_OUT)/bcd ./cmd/bcd
	$(GO) run ./tools/testdisk -kernel-dir $(KERNEL_DIR) -bcd $(TESTDISK_OUT)/bcd -out $(TESTDISK_OUT)

# The instance test image (docs/instance-runtime.md): a raw squashfs whose
# /sbin/init serves, with busybox httpd on port 8080, a page holding the
# host name and the user data's first line. Built from Debian's
# busybox-static with squashfs-tools' mksquashfs; nothing is downloaded.
TESTIMAGE_OUT ?= bin/testimage
testimage:
	$(GO) run ./tools/testimage -out $(TESTIMAGE_OUT)/image.squashfs
