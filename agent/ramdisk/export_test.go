package ramdisk

// ChooseDisk is chooseDisk, for the tests.
var ChooseDisk = chooseDisk
