// The one source of the precompiled-header holders of cmake/PushPrecompiled.cmake: the
// build compiles the shared headers for it once, and every target reuses the result.
