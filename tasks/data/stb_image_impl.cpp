// The one translation unit that compiles stb_image (PNG, JPEG, BMP decoders only).
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_FAILURE_USERMSG
#include <stb/stb_image.h>
