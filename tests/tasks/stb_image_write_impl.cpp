// stb_image_write (the PNG and JPEG writer the dataset tests make their fixtures with), compiled
// once, on its own: under UBSan without the shift check (tests/tasks/CMakeLists.txt).
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
