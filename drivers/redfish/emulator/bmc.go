package emulator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
)

// Resource paths. The system, its manager and its chassis are "1", as on
// the Supermicro BMCs whose shapes bmclib knows.
const (
	rootPath       = "/redfish/v1"
	systemPath     = rootPath + "/Systems/1"
	managerPath    = rootPath + "/Managers/1"
	chassisPath    = rootPath + "/Chassis/1"
	sessionsPath   = rootPath + "/SessionService/Sessions"
	tasksPath      = rootPath + "/TaskService/Tasks"
	monitorsPath   = rootPath + "/TaskService/TaskMonitors"
	biosPath       = systemPath + "/Bios"
	firmwarePath   = rootPath + "/UpdateService/FirmwareInventory"
	virtualMedia   = managerPath + "/VirtualMedia"
	hostLoggerPath = systemPath + "/LogServices/HostLogger"
	adminPath      = "/emulator/v1"
)

// The Redfish names of the boot targets, and of the media slots.
var (
	targetByDevice = map[drivers.BootDevice]string{
		drivers.BootPXE: "Pxe", drivers.BootCD: "Cd", drivers.BootDisk: "Hdd", drivers.BootBIOS: "BiosSetup",
	}
	deviceByTarget = map[string]drivers.BootDevice{
		"Pxe": drivers.BootPXE, "Cd": drivers.BootCD, "Hdd": drivers.BootDisk, "BiosSetup": drivers.BootBIOS, "None": "",
	}
	allowedTargets = []string{"None", "Pxe", "Cd", "Hdd", "BiosSetup"}
	mediaSlots     = []mediaSlotSpec{
		{ID: "Cd", Kind: machines.MediaCD, Types: []string{"CD", "DVD"}},
		{ID: "UsbStick", Kind: machines.MediaUSB, Types: []string{"USBStick"}},
	}
)

type mediaSlotSpec struct {
	ID    string
	Kind  string
	Types []string
}

type mediaSlot struct {
	image    string
	path     string
	inserted bool
	wp       bool
}

type session struct {
	id    string
	token string
	user  string
}

// defaultBIOS is the BIOS's factory settings, which ResetBios restores.
var defaultBIOS = map[string]any{
	"BootMode":          "Legacy",
	"ProcTurboMode":     "Enabled",
	"SriovGlobalEnable": "Disabled",
	"PowerProfile":      "MaxPerformance",
	"NumLock":           "On",
}

// BMC is one emulated BMC: its own HTTPS listener and its machine.
type BMC struct {
	e    *Emulator
	id   string
	m    machines.Machine
	addr string
	srv  *http.Server

	// ops serialises the writes that drive the machine, as a BMC runs one
	// power or media operation at a time.
	ops sync.Mutex

	mu          sync.Mutex
	faults      Faults
	counts      map[string]int
	notApplied  int
	sessions    map[string]*session // by token
	nextSession int
	bootMode    string
	media       map[string]*mediaSlot
	bios        map[string]any
	biosPending map[string]any
	firmware    map[string]string // component id -> version
	tasks       map[string]*task
	taskOrder   []string
	nextTask    int
	timers      []*time.Timer
	closed      bool
}

func newBMC(e *Emulator, id string, m machines.Machine, addr string) *BMC {
	b := &BMC{
		e: e, id: id, m: m, addr: addr,
		counts:   map[string]int{},
		sessions: map[string]*session{},
		bootMode: "Legacy",
		media:    map[string]*mediaSlot{},
		bios:     copyMap(defaultBIOS),
		firmware: map[string]string{"BMC": "1.0.0", "BIOS": "1.0.0"},
		tasks:    map[string]*task{},
	}
	for _, s := range mediaSlots {
		b.media[s.ID] = &mediaSlot{}
	}
	return b
}

// ID is the BMC's name in its emulator.
func (b *BMC) ID() string { return b.id }

// URL is the BMC's address as a Redfish client takes it ("https://127.0.0.1:port").
func (b *BMC) URL() string { return "https://" + b.addr }

// Addr is host:port.
func (b *BMC) Addr() string { return b.addr }

// Port is the listener's port.
func (b *BMC) Port() string {
	_, port, _ := strings.Cut(b.addr, "]:")
	if port == "" {
		_, port, _ = strings.Cut(b.addr, ":")
	}
	return port
}

// Machine is the machine the BMC controls.
func (b *BMC) Machine() machines.Machine { return b.m }

// SetFaults switches misbehaviour; the zero Faults switches it all off.
func (b *BMC) SetFaults(f Faults) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.faults = f
}

// Faults is the misbehaviour in force (counts as used up so far).
func (b *BMC) Faults() Faults {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.faults
}

// Requests is how many requests of that method reached that path (the
// admin endpoint's are not counted), faulted ones included.
func (b *BMC) Requests(method, path string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.counts[method+" "+cleanPath(path)]
}

// RequestCounts is every "METHOD /path" and how many requests it had.
func (b *BMC) RequestCounts() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return copyCounts(b.counts)
}

// NotApplied is how many writes were acknowledged without being applied.
func (b *BMC) NotApplied() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.notApplied
}

// ResetRequests zeroes the counts.
func (b *BMC) ResetRequests() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.counts = map[string]int{}
	b.notApplied = 0
}

func (b *BMC) close() error {
	b.mu.Lock()
	b.closed = true
	for _, t := range b.timers {
		t.Stop()
	}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := b.srv.Shutdown(ctx)
	if err != nil {
		err = b.srv.Close()
	}
	return errors.Join(err, b.m.Close())
}

func cleanPath(p string) string {
	for len(p) > 1 && strings.HasSuffix(p, "/") {
		p = strings.TrimSuffix(p, "/")
	}
	return p
}

// ServeHTTP counts the request, applies the faults, authenticates and
// routes.
func (b *BMC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := cleanPath(r.URL.Path)
	w.Header().Set("OData-Version", "4.0")
	if strings.HasPrefix(path, adminPath) {
		if !b.authenticated(r) {
			unauthorized(w)
			return
		}
		b.serveAdmin(w, r, path)
		return
	}
	b.mu.Lock()
	b.counts[r.Method+" "+path]++
	drop := take(&b.faults.Drop)
	unavailable := !drop && take(&b.faults.Unavailable)
	retryAfter := b.faults.RetryAfter
	b.mu.Unlock()
	if drop {
		// Aborting the handler closes the connection without an answer.
		panic(http.ErrAbortHandler)
	}
	if unavailable {
		if retryAfter <= 0 {
			retryAfter = time.Second
		}
		w.Header().Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
		writeError(w, http.StatusServiceUnavailable, "Base.1.8.ServiceTemporarilyUnavailable",
			"The service is temporarily unavailable; retry later.")
		return
	}
	public := (r.Method == http.MethodGet && (path == "/redfish" || path == rootPath || path == rootPath+"/odata" || path == rootPath+"/$metadata")) ||
		(r.Method == http.MethodPost && path == sessionsPath)
	if !public && !b.authenticated(r) {
		unauthorized(w)
		return
	}
	b.route(w, r, path)
}

func (b *BMC) authenticated(r *http.Request) bool {
	if tok := r.Header.Get("X-Auth-Token"); tok != "" {
		b.mu.Lock()
		defer b.mu.Unlock()
		_, ok := b.sessions[tok]
		return ok
	}
	user, pass, ok := r.BasicAuth()
	return ok && b.credentialsMatch(user, pass)
}

func (b *BMC) credentialsMatch(user, pass string) bool {
	u := subtle.ConstantTimeCompare([]byte(user), []byte(b.e.cfg.Username))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(b.e.cfg.Password))
	return u&p == 1
}

func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Basic realm="Redfish"`)
	writeError(w, http.StatusUnauthorized, "Base.1.8.InsufficientPrivilege",
		"There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.")
}

func (b *BMC) route(w http.ResponseWriter, r *http.Request, path string) {
	get, post, patch, del := r.Method == http.MethodGet, r.Method == http.MethodPost, r.Method == http.MethodPatch, r.Method == http.MethodDelete
	switch {
	case get && path == "/redfish":
		writeJSON(w, http.StatusOK, map[string]any{"v1": rootPath + "/"})
	case get && path == rootPath:
		b.writeResource(w, b.serviceRoot())
	case get && path == rootPath+"/Systems":
		b.writeResource(w, collection(rootPath+"/Systems", "#ComputerSystemCollection.ComputerSystemCollection", "Computer System Collection", systemPath))
	case get && path == systemPath:
		b.writeResource(w, b.system(r.Context()))
	case patch && path == systemPath:
		b.patchSystem(w, r)
	case post && path == systemPath+"/Actions/ComputerSystem.Reset":
		b.resetSystem(w, r)
	case get && path == systemPath+"/ResetActionInfo":
		b.writeResource(w, b.resetActionInfo())
	case get && path == systemPath+"/EthernetInterfaces":
		b.writeResource(w, collection(systemPath+"/EthernetInterfaces", "#EthernetInterfaceCollection.EthernetInterfaceCollection", "Ethernet Interface Collection", systemPath+"/EthernetInterfaces/1"))
	case get && path == systemPath+"/EthernetInterfaces/1":
		b.writeResource(w, b.ethernetInterface())
	case get && path == biosPath:
		b.writeResource(w, b.biosResource())
	case get && path == biosPath+"/Settings":
		b.writeResource(w, b.biosSettings())
	case patch && path == biosPath+"/Settings":
		b.patchBIOSSettings(w, r)
	case post && path == biosPath+"/Actions/Bios.ResetBios":
		b.resetBIOS(w, r)
	case get && path == systemPath+"/LogServices":
		b.writeResource(w, collection(systemPath+"/LogServices", "#LogServiceCollection.LogServiceCollection", "Log Service Collection", hostLoggerPath))
	case get && path == hostLoggerPath:
		b.writeResource(w, b.hostLogger())
	case get && path == hostLoggerPath+"/Entries":
		b.writeResource(w, b.hostLogEntries())
	case get && path == rootPath+"/Chassis":
		b.writeResource(w, collection(rootPath+"/Chassis", "#ChassisCollection.ChassisCollection", "Chassis Collection", chassisPath))
	case get && path == chassisPath:
		b.writeResource(w, b.chassis(r.Context()))
	case get && path == rootPath+"/Managers":
		b.writeResource(w, collection(rootPath+"/Managers", "#ManagerCollection.ManagerCollection", "Manager Collection", managerPath))
	case get && path == managerPath:
		b.writeResource(w, b.manager())
	case post && path == managerPath+"/Actions/Manager.Reset":
		b.resetManager(w, r)
	case get && path == virtualMedia:
		members := make([]string, 0, len(mediaSlots))
		for _, s := range mediaSlots {
			members = append(members, virtualMedia+"/"+s.ID)
		}
		b.writeResource(w, collection(virtualMedia, "#VirtualMediaCollection.VirtualMediaCollection", "Virtual Media Collection", members...))
	case strings.HasPrefix(path, virtualMedia+"/"):
		b.routeVirtualMedia(w, r, strings.TrimPrefix(path, virtualMedia+"/"))
	case get && path == rootPath+"/UpdateService":
		b.writeResource(w, b.updateService())
	case post && path == rootPath+"/UpdateService/Actions/UpdateService.SimpleUpdate":
		b.simpleUpdate(w, r)
	case get && path == firmwarePath:
		b.writeResource(w, collection(firmwarePath, "#SoftwareInventoryCollection.SoftwareInventoryCollection", "Firmware Inventory Collection", firmwarePath+"/BMC", firmwarePath+"/BIOS"))
	case get && strings.HasPrefix(path, firmwarePath+"/"):
		b.firmwareItem(w, strings.TrimPrefix(path, firmwarePath+"/"))
	case get && path == rootPath+"/TaskService":
		b.writeResource(w, taskService())
	case get && path == tasksPath:
		b.writeResource(w, b.taskCollection())
	case get && strings.HasPrefix(path, tasksPath+"/"):
		b.getTask(w, strings.TrimPrefix(path, tasksPath+"/"))
	case get && strings.HasPrefix(path, monitorsPath+"/"):
		b.taskMonitor(w, strings.TrimPrefix(path, monitorsPath+"/"))
	case get && path == rootPath+"/SessionService":
		b.writeResource(w, sessionService())
	case get && path == sessionsPath:
		b.writeResource(w, b.sessionCollection())
	case post && path == sessionsPath:
		b.createSession(w, r)
	case (get || del) && strings.HasPrefix(path, sessionsPath+"/"):
		b.sessionMember(w, r, strings.TrimPrefix(path, sessionsPath+"/"))
	default:
		if b.knownPath(path) {
			writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", "The operation is not allowed on this resource.")
			return
		}
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "The resource at the URI "+path+" was not found.")
	}
}

func (b *BMC) knownPath(path string) bool {
	switch path {
	case rootPath, rootPath + "/Systems", systemPath, rootPath + "/Chassis", chassisPath, rootPath + "/Managers",
		managerPath, virtualMedia, rootPath + "/UpdateService", firmwarePath, rootPath + "/TaskService", tasksPath,
		rootPath + "/SessionService", sessionsPath, biosPath, biosPath + "/Settings":
		return true
	}
	return false
}

// ackNotApply reports whether this write is to be acknowledged and dropped,
// counting it.
func (b *BMC) ackNotApply() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if take(&b.faults.AckNotApply) {
		b.notApplied++
		return true
	}
	return false
}

// writeResource writes a resource with its ETag, a hash of its body.
func (b *BMC) writeResource(w http.ResponseWriter, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", err.Error())
		return
	}
	w.Header().Set("ETag", etagOf(body))
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

func etagOf(body []byte) string {
	sum := sha256.Sum256(body)
	return `W/"` + hex.EncodeToString(sum[:8]) + `"`
}

// preconditionFails answers 412 when the request's If-Match names another
// version of the resource than the current one.
func preconditionFails(w http.ResponseWriter, r *http.Request, current any) bool {
	match := r.Header.Get("If-Match")
	if match == "" || match == "*" {
		return false
	}
	body, err := json.Marshal(current)
	if err != nil {
		return false
	}
	tag := etagOf(body)
	for _, m := range strings.Split(match, ",") {
		m = strings.TrimSpace(m)
		if m == tag || strings.TrimPrefix(m, "W/") == strings.TrimPrefix(tag, "W/") {
			return false
		}
	}
	writeError(w, http.StatusPreconditionFailed, "Base.1.8.PreconditionFailed",
		"The ETag supplied did not match the ETag required to change this resource.")
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, messageID, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"code":    messageID,
		"message": message,
		"@Message.ExtendedInfo": []map[string]any{{
			"@odata.type": "#Message.v1_1_1.Message",
			"MessageId":   messageID,
			"Message":     message,
			"Severity":    "Warning",
		}},
	}})
}

func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil && len(body) == 0 {
		body = []byte("{}")
	}
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.MalformedJSON", "The request body submitted was malformed JSON.")
		return false
	}
	return true
}

func odata(id, typ, name string) map[string]any {
	return map[string]any{"@odata.id": id, "@odata.type": typ, "Name": name}
}

func link(p string) map[string]any { return map[string]any{"@odata.id": p} }

func links(ps ...string) []map[string]any {
	out := make([]map[string]any, 0, len(ps))
	for _, p := range ps {
		out = append(out, link(p))
	}
	return out
}

func collection(id, typ, name string, members ...string) map[string]any {
	c := odata(id, typ, name)
	c["Members"] = links(members...)
	c["Members@odata.count"] = len(members)
	return c
}

func copyMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func randomToken() string {
	buf := make([]byte, 24)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}

func (b *BMC) serviceRoot() map[string]any {
	info := b.m.Info()
	root := odata(rootPath+"/", "#ServiceRoot.v1_11_0.ServiceRoot", "Root Service")
	root["Id"] = "RootService"
	root["RedfishVersion"] = "1.15.0"
	root["UUID"] = info.UUID
	root["Product"] = "Better Compute Redfish emulator"
	root["Vendor"] = "Better Compute"
	root["Systems"] = link(rootPath + "/Systems")
	root["Chassis"] = link(rootPath + "/Chassis")
	root["Managers"] = link(rootPath + "/Managers")
	root["SessionService"] = link(rootPath + "/SessionService")
	root["TaskService"] = link(rootPath + "/TaskService")
	root["UpdateService"] = link(rootPath + "/UpdateService")
	root["Links"] = map[string]any{"Sessions": link(sessionsPath)}
	return root
}

func redfishPower(p drivers.PowerState) string {
	switch p {
	case drivers.PowerOn:
		return "On"
	case drivers.PowerOff:
		return "Off"
	}
	return "Unknown"
}

func (b *BMC) resetTypes() []string {
	types := []string{"On", "ForceOff", "ForceRestart", "GracefulRestart", "PowerCycle"}
	if _, ok := b.m.(machines.Shutdowner); ok {
		types = append(types, "GracefulShutdown")
	}
	if _, ok := b.m.(machines.NMIer); ok {
		types = append(types, "Nmi")
	}
	return types
}

func (b *BMC) system(ctx context.Context) map[string]any {
	info := b.m.Info()
	power, err := b.m.PowerState(ctx)
	if err != nil {
		power = drivers.PowerUnknown
	}
	ov, err := b.m.BootOverride(ctx)
	if err != nil {
		ov = machines.Override{}
	}
	target, enabled := "None", "Disabled"
	if ov.Target != "" {
		target, enabled = targetByDevice[ov.Target], "Once"
		if ov.Persistent {
			enabled = "Continuous"
		}
	}
	b.mu.Lock()
	mode := b.bootMode
	biosVersion := b.firmware["BIOS"]
	b.mu.Unlock()
	sys := odata(systemPath, "#ComputerSystem.v1_13_0.ComputerSystem", "System")
	sys["Id"] = "1"
	sys["SystemType"] = "Physical"
	sys["UUID"] = info.UUID
	sys["SerialNumber"] = info.SerialNumber
	sys["Manufacturer"] = info.Manufacturer
	sys["Model"] = info.Model
	sys["BiosVersion"] = biosVersion
	sys["PowerState"] = redfishPower(power)
	sys["Status"] = map[string]any{"State": "Enabled", "Health": "OK"}
	sys["ProcessorSummary"] = map[string]any{"Count": info.CPUs, "Model": "QEMU Virtual CPU", "Status": map[string]any{"State": "Enabled", "Health": "OK"}}
	sys["MemorySummary"] = map[string]any{"TotalSystemMemoryGiB": float64(info.MemoryMiB) / 1024, "Status": map[string]any{"State": "Enabled", "Health": "OK"}}
	sys["Boot"] = map[string]any{
		"BootSourceOverrideEnabled":                         enabled,
		"BootSourceOverrideEnabled@Redfish.AllowableValues": []string{"Disabled", "Once", "Continuous"},
		"BootSourceOverrideMode":                            mode,
		"BootSourceOverrideMode@Redfish.AllowableValues":    []string{"Legacy", "UEFI"},
		"BootSourceOverrideTarget":                          target,
		"BootSourceOverrideTarget@Redfish.AllowableValues":  allowedTargets,
	}
	sys["EthernetInterfaces"] = link(systemPath + "/EthernetInterfaces")
	sys["Bios"] = link(biosPath)
	sys["LogServices"] = link(systemPath + "/LogServices")
	sys["Links"] = map[string]any{"Chassis": links(chassisPath), "ManagedBy": links(managerPath)}
	sys["Actions"] = map[string]any{"#ComputerSystem.Reset": map[string]any{
		"target":                            systemPath + "/Actions/ComputerSystem.Reset",
		"ResetType@Redfish.AllowableValues": b.resetTypes(),
		"@Redfish.ActionInfo":               systemPath + "/ResetActionInfo",
	}}
	return sys
}

func (b *BMC) resetActionInfo() map[string]any {
	info := odata(systemPath+"/ResetActionInfo", "#ActionInfo.v1_1_2.ActionInfo", "Reset Action Info")
	info["Id"] = "ResetActionInfo"
	info["Parameters"] = []map[string]any{{"Name": "ResetType", "Required": true, "DataType": "String", "AllowableValues": b.resetTypes()}}
	return info
}

// patchSystem applies a Boot override change (the system's one writable
// part here), honouring If-Match.
func (b *BMC) patchSystem(w http.ResponseWriter, r *http.Request) {
	b.ops.Lock()
	defer b.ops.Unlock()
	if preconditionFails(w, r, b.system(r.Context())) {
		return
	}
	var body struct {
		Boot *struct {
			BootSourceOverrideTarget  *string
			BootSourceOverrideEnabled *string
			BootSourceOverrideMode    *string
		}
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Boot == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	ctx := r.Context()
	current, err := b.m.BootOverride(ctx)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", err.Error())
		return
	}
	target, enabled := current.Target, "Disabled"
	if current.Target != "" {
		enabled = "Once"
		if current.Persistent {
			enabled = "Continuous"
		}
	}
	if t := body.Boot.BootSourceOverrideTarget; t != nil {
		dev, ok := deviceByTarget[*t]
		if !ok {
			writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList",
				fmt.Sprintf("The value %s for the property BootSourceOverrideTarget is not in the list of acceptable values.", *t))
			return
		}
		target = dev
		if enabled == "Disabled" && dev != "" && body.Boot.BootSourceOverrideEnabled == nil {
			enabled = "Once"
		}
	}
	if e := body.Boot.BootSourceOverrideEnabled; e != nil {
		switch *e {
		case "Disabled", "Once", "Continuous":
			enabled = *e
		default:
			writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList",
				fmt.Sprintf("The value %s for the property BootSourceOverrideEnabled is not in the list of acceptable values.", *e))
			return
		}
	}
	mode := ""
	if m := body.Boot.BootSourceOverrideMode; m != nil {
		if *m != "Legacy" && *m != "UEFI" {
			writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList",
				fmt.Sprintf("The value %s for the property BootSourceOverrideMode is not in the list of acceptable values.", *m))
			return
		}
		mode = *m
	}
	if b.ackNotApply() {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if enabled == "Disabled" {
		target = ""
	}
	if err := b.m.SetBootOverride(ctx, target, enabled == "Continuous"); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", err.Error())
		return
	}
	if mode != "" {
		b.mu.Lock()
		b.bootMode = mode
		b.mu.Unlock()
	}
	w.WriteHeader(http.StatusNoContent)
}

func (b *BMC) resetSystem(w http.ResponseWriter, r *http.Request) {
	b.ops.Lock()
	defer b.ops.Unlock()
	var body struct{ ResetType string }
	if !decodeBody(w, r, &body) {
		return
	}
	allowed := false
	for _, t := range b.resetTypes() {
		allowed = allowed || t == body.ResetType
	}
	if !allowed {
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterNotSupported",
			fmt.Sprintf("The parameter ResetType with the value %q is not supported by the action ComputerSystem.Reset.", body.ResetType))
		return
	}
	if b.ackNotApply() {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	ctx := r.Context()
	power, err := b.m.PowerState(ctx)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", err.Error())
		return
	}
	on := power == drivers.PowerOn
	switch body.ResetType {
	case "On":
		if !on {
			err = b.powerOn(ctx)
		}
	case "ForceOff":
		if on {
			err = b.m.PowerOff(ctx)
		}
	case "GracefulShutdown":
		if on {
			err = b.m.(machines.Shutdowner).Shutdown(ctx)
		}
	case "ForceRestart", "GracefulRestart":
		if !on {
			writeError(w, http.StatusConflict, "Base.1.8.ActionNotSupported",
				"The system is powered off: "+body.ResetType+" is not possible in its present state.")
			return
		}
		b.applyPendingBIOS()
		err = b.m.Reset(ctx)
	case "PowerCycle":
		if on {
			err = b.m.PowerOff(ctx)
		}
		if err == nil {
			err = b.powerOn(ctx)
		}
	case "Nmi":
		if !on {
			writeError(w, http.StatusConflict, "Base.1.8.ActionNotSupported", "The system is powered off: an NMI is not possible.")
			return
		}
		err = b.m.(machines.NMIer).NMI(ctx)
	}
	if err != nil {
		b.e.log.Warn("redfish emulator: reset", "bmc", b.id, "type", body.ResetType, "err", err)
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (b *BMC) powerOn(ctx context.Context) error {
	b.applyPendingBIOS()
	return b.m.PowerOn(ctx)
}

func (b *BMC) ethernetInterface() map[string]any {
	mac := b.m.Info().MAC
	nic := odata(systemPath+"/EthernetInterfaces/1", "#EthernetInterface.v1_6_0.EthernetInterface", "Ethernet Interface 1")
	nic["Id"] = "1"
	nic["MACAddress"] = mac
	nic["PermanentMACAddress"] = mac
	nic["SpeedMbps"] = 1000
	nic["LinkStatus"] = "LinkUp"
	nic["Status"] = map[string]any{"State": "Enabled", "Health": "OK"}
	return nic
}

func (b *BMC) chassis(ctx context.Context) map[string]any {
	info := b.m.Info()
	power, err := b.m.PowerState(ctx)
	if err != nil {
		power = drivers.PowerUnknown
	}
	c := odata(chassisPath, "#Chassis.v1_14_0.Chassis", "Chassis")
	c["Id"] = "1"
	c["ChassisType"] = "RackMount"
	c["Manufacturer"] = info.Manufacturer
	c["Model"] = info.Model
	c["SerialNumber"] = info.SerialNumber
	c["PowerState"] = redfishPower(power)
	c["Status"] = map[string]any{"State": "Enabled", "Health": "OK"}
	c["Links"] = map[string]any{"ComputerSystems": links(systemPath), "ManagedBy": links(managerPath)}
	return c
}

func (b *BMC) manager() map[string]any {
	b.mu.Lock()
	version := b.firmware["BMC"]
	b.mu.Unlock()
	m := odata(managerPath, "#Manager.v1_10_0.Manager", "Manager")
	m["Id"] = "1"
	m["ManagerType"] = "BMC"
	m["Model"] = "Redfish emulator"
	m["FirmwareVersion"] = version
	m["UUID"] = b.m.Info().UUID
	m["PowerState"] = "On"
	m["Status"] = map[string]any{"State": "Enabled", "Health": "OK"}
	m["VirtualMedia"] = link(virtualMedia)
	m["Links"] = map[string]any{"ManagerForServers": links(systemPath), "ManagerForChassis": links(chassisPath)}
	m["Actions"] = map[string]any{"#Manager.Reset": map[string]any{
		"target":                            managerPath + "/Actions/Manager.Reset",
		"ResetType@Redfish.AllowableValues": []string{"GracefulRestart", "ForceRestart"},
	}}
	return m
}

// resetManager restarts the BMC: its sessions end, the machine runs on.
func (b *BMC) resetManager(w http.ResponseWriter, r *http.Request) {
	var body struct{ ResetType string }
	if !decodeBody(w, r, &body) {
		return
	}
	if body.ResetType != "" && body.ResetType != "GracefulRestart" && body.ResetType != "ForceRestart" {
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterNotSupported", "ResetType "+body.ResetType+" is not supported by Manager.Reset.")
		return
	}
	b.mu.Lock()
	b.sessions = map[string]*session{}
	b.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func slotSpec(id string) (mediaSlotSpec, bool) {
	for _, s := range mediaSlots {
		if s.ID == id {
			return s, true
		}
	}
	return mediaSlotSpec{}, false
}

func (b *BMC) routeVirtualMedia(w http.ResponseWriter, r *http.Request, rest string) {
	if r.Method != http.MethodGet {
		b.ops.Lock()
		defer b.ops.Unlock()
	}
	id, action, hasAction := strings.Cut(rest, "/Actions/")
	spec, ok := slotSpec(id)
	if !ok {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "No virtual media "+id+".")
		return
	}
	switch {
	case !hasAction && r.Method == http.MethodGet:
		b.writeResource(w, b.mediaResource(spec))
	case !hasAction && r.Method == http.MethodPatch:
		b.patchMedia(w, r, spec)
	case hasAction && action == "VirtualMedia.InsertMedia" && r.Method == http.MethodPost:
		var body struct {
			Image          string
			Inserted       *bool
			WriteProtected *bool
		}
		if !decodeBody(w, r, &body) {
			return
		}
		if body.Image == "" {
			writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterMissing", "The action VirtualMedia.InsertMedia requires the parameter Image.")
			return
		}
		if body.Inserted != nil && !*body.Inserted {
			b.ejectMedia(w, r, spec)
			return
		}
		b.insertMedia(w, r, spec, body.Image, body.WriteProtected == nil || *body.WriteProtected)
	case hasAction && action == "VirtualMedia.EjectMedia" && r.Method == http.MethodPost:
		b.ejectMedia(w, r, spec)
	default:
		writeError(w, http.StatusMethodNotAllowed, "Base.1.8.OperationNotAllowed", "The operation is not allowed on this resource.")
	}
}

func (b *BMC) mediaResource(spec mediaSlotSpec) map[string]any {
	b.mu.Lock()
	slot := *b.media[spec.ID]
	b.mu.Unlock()
	p := virtualMedia + "/" + spec.ID
	v := odata(p, "#VirtualMedia.v1_3_0.VirtualMedia", "Virtual "+spec.ID)
	v["Id"] = spec.ID
	v["MediaTypes"] = spec.Types
	v["Image"] = nil
	v["ImageName"] = ""
	v["Inserted"] = slot.inserted
	v["WriteProtected"] = slot.wp
	v["ConnectedVia"] = "NotConnected"
	v["TransferProtocolType"] = nil
	if slot.inserted {
		v["Image"] = slot.image
		v["ImageName"] = filepath.Base(slot.image)
		v["ConnectedVia"] = "URI"
		if strings.HasPrefix(slot.image, "https:") {
			v["TransferProtocolType"] = "HTTPS"
		} else {
			v["TransferProtocolType"] = "HTTP"
		}
	}
	v["Actions"] = map[string]any{
		"#VirtualMedia.InsertMedia": map[string]any{"target": p + "/Actions/VirtualMedia.InsertMedia"},
		"#VirtualMedia.EjectMedia":  map[string]any{"target": p + "/Actions/VirtualMedia.EjectMedia"},
	}
	return v
}

func (b *BMC) patchMedia(w http.ResponseWriter, r *http.Request, spec mediaSlotSpec) {
	if preconditionFails(w, r, b.mediaResource(spec)) {
		return
	}
	var body struct {
		Image          *string
		Inserted       *bool
		WriteProtected *bool
	}
	if !decodeBody(w, r, &body) {
		return
	}
	switch {
	case body.Inserted != nil && !*body.Inserted, body.Image != nil && *body.Image == "":
		b.ejectMedia(w, r, spec)
	case body.Image != nil:
		b.insertMedia(w, r, spec, *body.Image, body.WriteProtected == nil || *body.WriteProtected)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// insertMedia fetches the image from its URL, as a BMC does, then puts the
// local copy in the machine's drive. An image already in the slot is
// replaced.
func (b *BMC) insertMedia(w http.ResponseWriter, r *http.Request, spec mediaSlotSpec, image string, writeProtected bool) {
	if !strings.HasPrefix(image, "http://") && !strings.HasPrefix(image, "https://") {
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterValueFormatError",
			"The value of the parameter Image must be an http or https URL.")
		return
	}
	if b.ackNotApply() {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	path, err := b.fetch(r.Context(), image, spec.Kind)
	if err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.ResourceAtUriUnauthorized", "The image could not be fetched: "+err.Error())
		return
	}
	ctx := r.Context()
	if err := b.m.InsertMedia(ctx, machines.Media{Kind: spec.Kind, URL: image, Path: path}); err != nil {
		_ = os.Remove(path)
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionNotSupported", err.Error())
		return
	}
	b.mu.Lock()
	slot := b.media[spec.ID]
	old := slot.path
	*slot = mediaSlot{image: image, path: path, inserted: true, wp: writeProtected}
	b.mu.Unlock()
	if old != "" && old != path {
		_ = os.Remove(old)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (b *BMC) ejectMedia(w http.ResponseWriter, r *http.Request, spec mediaSlotSpec) {
	if b.ackNotApply() {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err := b.m.EjectMedia(r.Context(), spec.Kind); err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", err.Error())
		return
	}
	b.mu.Lock()
	slot := b.media[spec.ID]
	old := slot.path
	*slot = mediaSlot{}
	b.mu.Unlock()
	if old != "" {
		_ = os.Remove(old)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (b *BMC) fetch(ctx context.Context, url, kind string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := b.e.mediaFetch.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.CreateTemp(b.e.mediaDir, fmt.Sprintf("%s-%s-*.img", safeName(b.id), kind))
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, s)
}

func (b *BMC) biosResource() map[string]any {
	b.mu.Lock()
	attrs := copyMap(b.bios)
	b.mu.Unlock()
	bios := odata(biosPath, "#Bios.v1_1_0.Bios", "BIOS Configuration")
	bios["Id"] = "Bios"
	bios["AttributeRegistry"] = "BiosAttributeRegistry.v1_0_0"
	bios["Attributes"] = attrs
	bios["@Redfish.Settings"] = map[string]any{
		"@odata.type":         "#Settings.v1_3_0.Settings",
		"SettingsObject":      link(biosPath + "/Settings"),
		"SupportedApplyTimes": []string{"OnReset"},
	}
	bios["Actions"] = map[string]any{"#Bios.ResetBios": map[string]any{"target": biosPath + "/Actions/Bios.ResetBios"}}
	return bios
}

func (b *BMC) biosSettings() map[string]any {
	b.mu.Lock()
	attrs := copyMap(b.bios)
	for k, v := range b.biosPending {
		attrs[k] = v
	}
	b.mu.Unlock()
	s := odata(biosPath+"/Settings", "#Bios.v1_1_0.Bios", "BIOS Pending Settings")
	s["Id"] = "Settings"
	s["Attributes"] = attrs
	return s
}

// patchBIOSSettings records pending attributes, applied at the next power
// on or reset, as BIOS settings are.
func (b *BMC) patchBIOSSettings(w http.ResponseWriter, r *http.Request) {
	if preconditionFails(w, r, b.biosSettings()) {
		return
	}
	var body struct{ Attributes map[string]any }
	if !decodeBody(w, r, &body) {
		return
	}
	for k := range body.Attributes {
		if _, ok := defaultBIOS[k]; !ok {
			writeError(w, http.StatusBadRequest, "Base.1.8.PropertyUnknown", "The property "+k+" is not in the BIOS attribute registry.")
			return
		}
	}
	if b.ackNotApply() {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	b.mu.Lock()
	if b.biosPending == nil {
		b.biosPending = map[string]any{}
	}
	for k, v := range body.Attributes {
		b.biosPending[k] = v
	}
	b.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (b *BMC) applyPendingBIOS() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, v := range b.biosPending {
		b.bios[k] = v
	}
	b.biosPending = nil
}

// resetBIOS starts a task that restores the factory settings.
func (b *BMC) resetBIOS(w http.ResponseWriter, r *http.Request) {
	apply := !b.ackNotApply()
	b.startTask(w, "Bios.ResetBios", func(context.Context) error {
		if apply {
			b.mu.Lock()
			b.bios = copyMap(defaultBIOS)
			b.biosPending = nil
			b.mu.Unlock()
		}
		return nil
	})
}

// BIOSAttributes is the BIOS's current settings (pending ones excluded).
func (b *BMC) BIOSAttributes() map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	return copyMap(b.bios)
}

func (b *BMC) updateService() map[string]any {
	u := odata(rootPath+"/UpdateService", "#UpdateService.v1_8_0.UpdateService", "Update Service")
	u["Id"] = "UpdateService"
	u["ServiceEnabled"] = true
	u["Status"] = map[string]any{"State": "Enabled", "Health": "OK"}
	u["FirmwareInventory"] = link(firmwarePath)
	u["Actions"] = map[string]any{"#UpdateService.SimpleUpdate": map[string]any{
		"target": rootPath + "/UpdateService/Actions/UpdateService.SimpleUpdate",
		"TransferProtocol@Redfish.AllowableValues": []string{"HTTP", "HTTPS"},
	}}
	return u
}

func (b *BMC) firmwareItem(w http.ResponseWriter, id string) {
	b.mu.Lock()
	version, ok := b.firmware[id]
	b.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "No firmware component "+id+".")
		return
	}
	f := odata(firmwarePath+"/"+id, "#SoftwareInventory.v1_2_0.SoftwareInventory", id)
	f["Id"] = id
	f["Version"] = version
	f["Updateable"] = true
	f["Status"] = map[string]any{"State": "Enabled", "Health": "OK"}
	b.writeResource(w, f)
}

// simpleUpdate starts a task that fetches the image and installs it: the
// component's version becomes the image's digest, which names what runs.
func (b *BMC) simpleUpdate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		ImageURI string
		Targets  []string
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if body.ImageURI == "" {
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterMissing", "The action UpdateService.SimpleUpdate requires the parameter ImageURI.")
		return
	}
	component := "BIOS"
	for _, t := range body.Targets {
		id := strings.TrimPrefix(cleanPath(t), firmwarePath+"/")
		b.mu.Lock()
		_, ok := b.firmware[id]
		b.mu.Unlock()
		if !ok {
			writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterValueNotInList", "No firmware component "+t+".")
			return
		}
		component = id
	}
	apply := !b.ackNotApply()
	b.startTask(w, "UpdateService.SimpleUpdate", func(ctx context.Context) error {
		path, err := b.fetch(ctx, body.ImageURI, "firmware")
		if err != nil {
			return err
		}
		defer os.Remove(path)
		digest, err := fileDigest(path)
		if err != nil {
			return err
		}
		if apply {
			b.mu.Lock()
			b.firmware[component] = "sha256-" + digest[:12]
			b.mu.Unlock()
		}
		return nil
	})
}

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Firmware is the firmware inventory: component id to version.
func (b *BMC) Firmware() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]string, len(b.firmware))
	for k, v := range b.firmware {
		out[k] = v
	}
	return out
}

func (b *BMC) hostLogger() map[string]any {
	l := odata(hostLoggerPath, "#LogService.v1_1_3.LogService", "Host Logger Service")
	l["Id"] = "HostLogger"
	l["Description"] = "The host's serial console"
	l["Entries"] = link(hostLoggerPath + "/Entries")
	l["ServiceEnabled"] = true
	return l
}

// hostLogEntries is the serial console as log entries, one per line, the
// way OpenBMC's host logger exposes it.
func (b *BMC) hostLogEntries() map[string]any {
	lines := strings.SplitAfter(string(b.m.SerialLog()), "\n")
	if n := len(lines); n > 0 && lines[n-1] == "" {
		lines = lines[:n-1]
	}
	members := make([]map[string]any, 0, len(lines))
	for i, line := range lines {
		id := strconv.Itoa(i + 1)
		e := odata(hostLoggerPath+"/Entries/"+id, "#LogEntry.v1_8_0.LogEntry", "Host Logger Entry")
		e["Id"] = id
		e["EntryType"] = "Oem"
		e["OemRecordFormat"] = "Host Logger Entry"
		e["Severity"] = "OK"
		e["Message"] = line
		members = append(members, e)
	}
	c := odata(hostLoggerPath+"/Entries", "#LogEntryCollection.LogEntryCollection", "HostLogger Entries")
	c["Members"] = members
	c["Members@odata.count"] = len(members)
	return c
}

func sessionService() map[string]any {
	s := odata(rootPath+"/SessionService", "#SessionService.v1_1_8.SessionService", "Session Service")
	s["Id"] = "SessionService"
	s["ServiceEnabled"] = true
	s["SessionTimeout"] = 1800
	s["Sessions"] = link(sessionsPath)
	return s
}

func (b *BMC) sessionCollection() map[string]any {
	b.mu.Lock()
	ids := make([]string, 0, len(b.sessions))
	for _, s := range b.sessions {
		ids = append(ids, sessionsPath+"/"+s.id)
	}
	b.mu.Unlock()
	sort.Strings(ids)
	return collection(sessionsPath, "#SessionCollection.SessionCollection", "Session Collection", ids...)
}

func sessionResource(s *session) map[string]any {
	r := odata(sessionsPath+"/"+s.id, "#Session.v1_3_0.Session", "User Session")
	r["Id"] = s.id
	r["UserName"] = s.user
	r["Password"] = nil
	return r
}

func (b *BMC) createSession(w http.ResponseWriter, r *http.Request) {
	var body struct {
		UserName string
		Password string
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if !b.credentialsMatch(body.UserName, body.Password) {
		unauthorized(w)
		return
	}
	b.mu.Lock()
	b.nextSession++
	s := &session{id: strconv.Itoa(b.nextSession), token: randomToken(), user: body.UserName}
	b.sessions[s.token] = s
	b.mu.Unlock()
	w.Header().Set("X-Auth-Token", s.token)
	w.Header().Set("Location", sessionsPath+"/"+s.id)
	writeJSON(w, http.StatusCreated, sessionResource(s))
}

func (b *BMC) sessionMember(w http.ResponseWriter, r *http.Request, id string) {
	b.mu.Lock()
	var found *session
	for _, s := range b.sessions {
		if s.id == id {
			found = s
		}
	}
	if found != nil && r.Method == http.MethodDelete {
		delete(b.sessions, found.token)
	}
	b.mu.Unlock()
	switch {
	case found == nil:
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "No session "+id+".")
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	default:
		b.writeResource(w, sessionResource(found))
	}
}

// Sessions is how many sessions are open.
func (b *BMC) Sessions() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.sessions)
}

// serveAdmin is the misbehaviour switchboard: GET/PUT faults, GET/DELETE
// request counts, GET the serial console.
func (b *BMC) serveAdmin(w http.ResponseWriter, r *http.Request, path string) {
	switch {
	case path == adminPath+"/faults" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, b.Faults())
	case path == adminPath+"/faults" && (r.Method == http.MethodPut || r.Method == http.MethodPost):
		var f Faults
		if !decodeBody(w, r, &f) {
			return
		}
		b.SetFaults(f)
		writeJSON(w, http.StatusOK, f)
	case path == adminPath+"/requests" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"requests": b.RequestCounts(), "notApplied": b.NotApplied()})
	case path == adminPath+"/requests" && r.Method == http.MethodDelete:
		b.ResetRequests()
		w.WriteHeader(http.StatusNoContent)
	case path == adminPath+"/console" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(b.m.SerialLog())
	default:
		writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "No admin resource "+path+".")
	}
}
