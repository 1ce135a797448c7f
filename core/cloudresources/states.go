package cloudresources

// ResourceType is the catalog type a cloud resource is decided on.
const ResourceType = "cloud-resource"

// IDPrefix starts every cloud resource id.
const IDPrefix = "crs"

// States of a resource (cloud-resources-api.md). Draft and Denied are the
// admission's: never listed, never answered.
const (
	StateDraft        = "draft"
	StateDenied       = "denied"
	StatePending      = "pending"
	StateProvisioning = "provisioning"
	StateReady        = "ready"
	StateUpdating     = "updating"
	StateDeleting     = "deleting"
	StateDeleted      = "deleted"
	StateReleased     = "released"
	StateError        = "error"
)

// Ended says whether a resource in state s is gone from its tenant's
// live set (its name and identity are free again).
func Ended(s string) bool {
	return s == StateDeleted || s == StateReleased || s == StateDenied
}

// What the tenant wants of a resource: kept, deleted or released.
const (
	DesiredPresent  = "present"
	DesiredDeleted  = "deleted"
	DesiredReleased = "released"
)

// Event types published through the events outbox.
const (
	EventCreated   = "cloud.resource.created"
	EventReady     = "cloud.resource.ready"
	EventFailed    = "cloud.resource.failed"
	EventUpdating  = "cloud.resource.updating"
	EventUpdated   = "cloud.resource.updated"
	EventDeleting  = "cloud.resource.deleting"
	EventDeleted   = "cloud.resource.deleted"
	EventAdopted   = "cloud.resource.adopted"
	EventReleasing = "cloud.resource.releasing"
	EventReleased  = "cloud.resource.released"
)

// MeterHours is the meter a resource bills: one unit per hour, from the
// provider's first acceptance (an adopted one's first ready) to its end.
const MeterHours = "cloud.resource.hours"

// Billing modes of a pool under which a resource bills MeterHours.
func Bills(billingMode string) bool { return billingMode == "metered" || billingMode == "platform-fee" }
