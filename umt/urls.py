from django.contrib import admin
from django.urls import path

from tasks_engine import views as tasks_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics/", tasks_views.metrics, name="tasks-metrics"),
]
