// libtrident.so's own translation unit: the layers come in whole from their static archives.
namespace trident {
extern const char* const kVersion;
const char* const kVersion = TRIDENT_VERSION;
}  // namespace trident
