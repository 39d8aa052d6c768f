// Placeholder; replaced by the real headers.
#pragma once
